"""devplug-nvidia as a process with sharing configured: the resources served after renames."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from devplug import KubeletError
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.support import logged_process, wait_until

pytestmark = pytest.mark.anyio
_NVIDIA_ENV = (
    "MIG_STRATEGY",
    "CONFIG_FILE",
    "FAIL_ON_INIT_ERROR",
    "NVIDIA_DRIVER_ROOT",
    "DEVPLUG_FAKE_NVML",
    "DP_DISABLE_HEALTHCHECKS",
    "DP_ENABLE_HEALTHCHECKS",
)


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NVIDIA_ENV} | extra


@asynccontextmanager
async def plugin_process(
    log: Path, args: list[str], env: dict[str, str] | None = None
) -> AsyncIterator[Process]:
    async with logged_process("devplug_nvidia", args, log, env=env or _env()) as process:
        yield process


def _args(short_dir: Path, model: str, config: dict[str, Any]) -> list[str]:
    # --fake-nvml lays the model's /sys, /proc and /dev out itself.
    config_file = short_dir / "config.json"
    config_file.write_text(json.dumps(config))
    return [
        "--fake-nvml",
        model,
        "--device-plugin-dir",
        str(short_dir / "dp"),
        "--config-file",
        str(config_file),
    ]


async def test_time_slicing_subset_and_renames_are_served(short_dir: Path) -> None:
    config = {
        "sharing": {
            "timeSlicing": {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "devices": [0, 1], "replicas": 3}],
            }
        }
    }
    args = _args(short_dir, "pcie-a10", config)
    async with FakeKubelet(short_dir / "dp") as kubelet, plugin_process(short_dir / "log", args):
        shared = await kubelet.wait_for_devices("nvidia.com/gpu.shared", lambda ds: len(ds) == 6, timeout=20)
        whole = await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 2, timeout=20)
        assert all("::" in d.id for d in shared) and not any("::" in d.id for d in whole)
        assert [d.numa_nodes for d in shared] == [(0,)] * 6
        got = await kubelet.allocate("nvidia.com/gpu.shared", [shared[4].id])
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == shared[4].id.split("::")[0]
        with pytest.raises(KubeletError) as info:
            await kubelet.allocate("nvidia.com/gpu.shared", [shared[0].id, shared[3].id])
        assert "invalid request: maximum request size for shared resources is 1; found 2" in str(info.value)
        # Whole GPUs are not shared: two of them in one request are fine.
        got = await kubelet.allocate("nvidia.com/gpu", [d.id for d in whole])
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.id for d in whole)


async def test_sharing_error_exits_2_with_one_line(short_dir: Path) -> None:
    config = {
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "devices": 9, "replicas": 2}]}}
    }
    args = _args(short_dir, "pcie-a10", config)
    result = await anyio.run_process([sys.executable, "-m", "devplug_nvidia", *args], check=False, env=_env())
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1 and "requested 9 devices to be replicated, but only 4" in err, err


async def test_health_checks_disabled_by_environment(short_dir: Path) -> None:
    args = _args(short_dir, "pcie-a10", {})
    log = short_dir / "log"
    env = _env(DP_DISABLE_HEALTHCHECKS="all")
    async with FakeKubelet(short_dir / "dp") as kubelet, plugin_process(log, args, env):
        await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 4, timeout=20)
        await wait_until(lambda: "health_checks_disabled" in log.read_text(), interval=0.05)


async def test_sighup_rereads_the_config_file(short_dir: Path) -> None:
    import signal

    def sharing(replicas: int) -> dict[str, Any]:
        return {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}

    args = _args(short_dir, "pcie-a10", sharing(2))
    config_file = short_dir / "config.json"
    log = short_dir / "log"
    async with FakeKubelet(short_dir / "dp") as kubelet, plugin_process(log, args) as process:
        await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 8, timeout=20)
        config_file.write_text(json.dumps(sharing(3)))
        signal_child(process, signal.SIGHUP)
        await kubelet.wait_for_registration("nvidia.com/gpu", count=2, timeout=20)
        devices = await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 12)
        assert {d.numa_nodes for d in devices} == {(0,), (1,)}  # still the model's tree
        # An invalid file is logged and the running configuration stays.
        config_file.write_text(json.dumps({"sharing": {"timeSlicing": {"renameByDefault": "maybe"}}}))
        signal_child(process, signal.SIGHUP)
        await wait_until(lambda: "reload_failed" in log.read_text(), timeout=10, interval=0.05)
        assert sum(r.accepted for r in kubelet.registrations) == 2
        assert len(kubelet.resource("nvidia.com/gpu").devices) == 12
