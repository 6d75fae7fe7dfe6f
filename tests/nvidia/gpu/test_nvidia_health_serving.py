"""Health end to end: NVML events in the fake reach a FakeKubelet through the served plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

from devplug.testing import FakeKubelet, serving
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._cli._main import build_plugins
from devplug_nvidia._config._file import Sharing
from devplug_nvidia._device_plugin._sharing import apply_sharing
from tests.nvidia.nvidia_health_kit import monitoring

pytestmark = pytest.mark.anyio

GPU = "nvidia.com/gpu"


async def test_xid_reaches_the_kubelet_and_the_gpu_comes_back(
    fake_kubelet: FakeKubelet, tmp_path: Path
) -> None:
    async with monitoring("dgx-a100", tmp_path) as m:
        settings = NvidiaSettings()
        resources = apply_sharing(m.resources, settings.sharing)
        plugins = build_plugins(resources, settings, present=frozenset(), imex=(), health=m.monitor)
        async with serving(plugins, fake_kubelet):
            await fake_kubelet.wait_for_devices(GPU, lambda ds: len(ds) == 8 and all(d.healthy for d in ds))
            bad = m.resources[GPU][4].uuid
            m.fake.push_xid(4, 94)
            await fake_kubelet.wait_for_devices(GPU, lambda ds: [d.id for d in ds if not d.healthy] == [bad])
            assert fake_kubelet.allocatable(GPU) == 7 and fake_kubelet.capacity(GPU) == 8
            await fake_kubelet.wait_for_devices(GPU, lambda ds: all(d.healthy for d in ds))


async def test_lost_gpu_reaches_every_resource_on_it(fake_kubelet: FakeKubelet, tmp_path: Path) -> None:
    # Mixed MIG with time-slicing on the 1g.5gb devices (renamed): GPU 0 holds all seven of them.
    sharing = Sharing.model_validate(
        {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "rename": "small", "replicas": 2}]}}
    )
    settings = NvidiaSettings(mig_strategy="mixed", sharing=sharing)
    async with monitoring("mig-mixed", tmp_path, "mixed") as m:
        resources = apply_sharing(m.resources, sharing)
        plugins = build_plugins(resources, settings, present=frozenset(), imex=(), health=m.monitor)
        # mig-1g.5gb is shared away entirely: its seven devices are "small" now.
        assert sorted(p.resource_name.removeprefix("nvidia.com/") for p in plugins) == [
            "gpu",
            "mig-1c.3g.20gb",
            "mig-1g.10gb",
            "mig-1g.5gb.me",
            "mig-2c.3g.20gb",
            "mig-2g.10gb",
            "mig-4g.20gb",
            "small",
        ]
        async with serving(plugins, fake_kubelet):
            shared = await fake_kubelet.wait_for_devices("nvidia.com/small", lambda ds: len(ds) == 14)
            assert all("::" in d.id for d in shared)
            await fake_kubelet.wait_for_devices("nvidia.com/mig-2g.10gb", lambda ds: len(ds) == 2)
            m.fake.lose_gpu(0)
            await fake_kubelet.wait_for_devices("nvidia.com/small", lambda ds: not any(d.healthy for d in ds))
            # The wait error marks everything; the GPUs still on the bus come back, GPU 0 does not.
            await fake_kubelet.wait_for_devices(
                "nvidia.com/mig-2g.10gb", lambda ds: all(d.healthy for d in ds)
            )
            assert fake_kubelet.allocatable("nvidia.com/small") == 0
