"""``--api dra --withhold-device-plugin-pods``: a node moving from a device plugin to DRA keeps the
devices that the device plugin's pods still hold out of every claim until those pods end.

The old device plugin runs against the fake kubelet, gives devices to pods, and stops; the pods
keep running (the fake kubelet's pod-resources API lists them, as the real one does); then the
DRA driver starts on the node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from devplug import Device
from devplug.testing import FakeKubeAPI, FakeKubelet, serving, serving_dra
from devplug.testing._kubeapi.scheduler import AllocationError
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

HELD = "widget.example.com/device-plugin"


def tainted(api: FakeKubeAPI, key: str = HELD) -> set[str]:
    return {
        device["name"]
        for piece in api.slices()
        for device in piece["spec"].get("devices") or ()
        if any(t["key"] == key for t in device.get("taints") or ())
    }


@asynccontextmanager
async def pods_of_a_stopped_device_plugin(
    kubelet: FakeKubelet, plugin: Widgets, given: dict[str, list[str]]
) -> AsyncIterator[None]:
    """Run ``plugin`` as a device plugin, give each pod of ``given`` its devices, stop it."""
    async with serving(plugin, kubelet):
        await kubelet.wait_for_devices(plugin.resource_name)
        for pod, ids in given.items():
            await kubelet.allocate(plugin.resource_name, ids, pod=pod)
    yield


async def test_the_old_pods_devices_are_tainted_until_they_end(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with (
        pods_of_a_stopped_device_plugin(kubelet, Widgets(), {"jobs/train-0": ["w1", "w2"]}),
        serving_dra(
            Widgets(), api, kubelet, withhold_device_plugin_pods=True, pod_resources_interval=0.2
        ) as driver,
    ):
        # The first slices already carry the taints: nothing was published before the read.
        await api.wait_for_slices(kubelet.node_name, "widget.example.com")
        assert tainted(api) == {"w1", "w2"}
        assert driver.debug_state()["ledger"]["held"] == {"device-plugin": 2, "dra": 0}
        api.add_claim("ns", "c")
        with pytest.raises(AllocationError):
            api.allocate_claim("ns", "c", node=kubelet.node_name, driver="widget.example.com", count=3)
        two = api.allocate_claim("ns", "c", node=kubelet.node_name, driver="widget.example.com", count=2)
        assert {r["device"] for r in two["status"]["allocation"]["devices"]["results"]} == {"w0", "w3"}
        kubelet.end_pod("jobs/train-0")
        await wait_until(lambda: tainted(api) == set(), timeout=5, what="the taints gone with the pod")


async def test_without_the_flag_a_dra_driver_reads_no_pods(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with (
        pods_of_a_stopped_device_plugin(kubelet, Widgets(), {"jobs/train-0": ["w1"]}),
        serving_dra(Widgets(), api, kubelet) as driver,
    ):
        await api.wait_for_slices(kubelet.node_name, "widget.example.com")
        assert tainted(api) == set()
        assert "ledger" not in driver.debug_state()


async def test_nvidia_gpus_held_by_the_device_plugin_s_pods_are_withheld(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """NVIDIA's device plugin names GPUs by UUID, time-sliced replicas ``UUID::n``."""
    api, kubelet = fake_kube_api, fake_dra_kubelet
    root = write_root(MODELS["dgx-a100"], tmp_path / "root")
    settings = NvidiaSettings(driver_root=str(root), driver_name="gpu.nvidia.com")
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(MODELS["dgx-a100"]), sysfs=root / "sys", proc=root / "proc"
    )
    gpus = {d.name: d.id for d in plugin.devices if d.name.startswith("gpu-")}
    old = Widgets("nvidia.com/gpu", [Device(id=f"{gpus['gpu-0']}::1"), Device(id=gpus["gpu-1"])])
    given = {"jobs/a": [f"{gpus['gpu-0']}::1"], "jobs/b": [gpus["gpu-1"]]}
    async with (
        pods_of_a_stopped_device_plugin(kubelet, old, given),
        serving_dra(plugin, api, kubelet, withhold_device_plugin_pods=True, pod_resources_interval=0.2),
    ):
        await api.wait_for_slices(kubelet.node_name, "gpu.nvidia.com")
        assert tainted(api, "gpu.nvidia.com/device-plugin") == {"gpu-0", "gpu-1"}
        kubelet.end_pod("jobs/a")
        await wait_until(lambda: tainted(api, "gpu.nvidia.com/device-plugin") == {"gpu-1"}, timeout=5)
