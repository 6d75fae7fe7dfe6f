"""devplug-nvidia --api dra: XIDs and lost GPUs become device taints as NVIDIA's DRA driver v0.4
publishes them, recoverable ones go after the quiet period, and the kubelet's health stream
follows (FakeNvml's event injection, FakeKubeAPI's slices, FakeKubelet's health cache)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import HealthSettings
from devplug.testing import FakeKubeAPI, FakeKubelet, serving_dra
from devplug_nvidia._dra._health import additional_ignored, dra_health_monitor, health_enabled
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from tests.nvidia.nvidia_dra_kit import DRIVER, NODE, dra_cluster, published_taints, wait_taints
from tests.support import never_within

pytestmark = pytest.mark.anyio

COOLDOWN = 0.3
XID = f"{DRIVER}/xid"


@dataclass
class Node:
    api: FakeKubeAPI
    kubelet: FakeKubelet
    plugin: NvidiaDraPlugin
    fake: FakeNvml

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        return published_taints(self.api)

    async def wait_taints(self, predicate: Any) -> dict[str, list[dict[str, Any]]]:
        return await wait_taints(self.api, predicate)

    def device_health(self, name: str) -> str:
        """The health the driver holds for device ``name`` now (what its health stream sends)."""
        assert self.plugin.health is not None
        device = next(d for d in self.plugin.devices if d.name == name)
        return self.plugin.health.health(device.id).value

    def health(self) -> dict[str, str]:
        return {device: state for (_pool, device), state in self.kubelet.health(DRIVER).items()}

    async def wait_health(self, predicate: Any) -> dict[str, str]:
        await self.kubelet.wait_for_health(
            DRIVER, lambda view: predicate({d: s for (_p, d), s in view.items()}), timeout=10
        )
        return self.health()


@asynccontextmanager
async def node(model: str, short_dir: Path, **settings: Any) -> AsyncIterator[Node]:
    root = write_root(MODELS[model], short_dir / "root")
    config = NvidiaSettings(
        driver_root=str(root),
        driver_name=DRIVER,
        health=HealthSettings(recovery_cooldown=COOLDOWN),
    )
    for name, value in settings.items():
        object.__setattr__(config, name, value)
    fake = FakeNvml(MODELS[model])
    plugin = NvidiaDraPlugin.discover(config, module=fake, sysfs=root / "sys", proc=root / "proc")
    # The monitor discovery made, with waits short enough for a test.
    plugin.health = dra_health_monitor(
        config, plugin.records, DRIVER, module=fake, wait_timeout=0.05, retry_interval=0.2
    )
    assert plugin.health is not None
    async with dra_cluster(short_dir) as (api, kubelet, kubelet_root), anyio.create_task_group() as tg:
        tg.start_soon(plugin.health.run)
        with anyio.fail_after(10):
            await plugin.health.wait_started()
        async with serving_dra(plugin, api, kubelet_root, node_name=NODE):
            await kubelet.wait_for_usable(DRIVER, timeout=10)
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)
            yield Node(api, kubelet, plugin, fake)
        tg.cancel_scope.cancel()


async def test_a_recoverable_xid_taints_the_gpu_until_the_quiet_period_is_over(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir) as n:
        everyone = {f"gpu-{i}": "Healthy" for i in range(4)}
        await n.wait_health(lambda h: h == everyone)
        # The monitor run here, not a second one from the plugin's device stream.
        assert sum(1 for s in n.fake._sets() if not s.freed) == 1
        assert n.taints() == {f"gpu-{i}": [] for i in range(4)}
        n.fake.push_xid(0, 94)
        taints = await n.wait_taints(lambda t: t["gpu-0"])
        assert taints["gpu-0"] == [{"key": XID, "value": "94", "effect": "NoSchedule"}]
        assert not any(taints[f"gpu-{i}"] for i in (1, 2, 3))
        health = await n.wait_health(lambda h: h.get("gpu-0") == "Unhealthy")
        assert health == {**everyone, "gpu-0": "Unhealthy"}
        messages = n.kubelet.health_messages(DRIVER)
        assert messages[(NODE, "gpu-0")] == "a failed check (last: XID 94)"
        assert not any(messages[(NODE, f"gpu-{i}")] for i in (1, 2, 3))
        # Quiet for the cooldown: the taint goes and the kubelet hears Healthy again.
        await n.wait_taints(lambda t: not any(t.values()))
        await n.wait_health(lambda h: h == everyone)


async def test_a_fatal_xid_stays_while_a_later_recoverable_one_recovers(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir) as n:
        n.fake.push_xid(0, 79)
        await n.wait_taints(lambda t: t["gpu-0"])
        n.fake.push_xid(0, 94)  # a later XID on a GPU failed for good does not replace 79
        n.fake.push_xid(1, 94)
        await n.wait_taints(lambda t: t["gpu-1"])
        # GPU 1 recovered after the cooldown, which GPU 0's older event passed too.
        taints = await n.wait_taints(lambda t: not t["gpu-1"])
        assert taints["gpu-0"] == [{"key": XID, "value": "79", "effect": "NoSchedule"}]
        health = await n.wait_health(lambda h: h.get("gpu-1") == "Healthy")
        assert health["gpu-0"] == "Unhealthy"
        # Failed for good: the message is the event that did it.
        assert n.kubelet.health_messages(DRIVER)[(NODE, "gpu-0")] == "XID 79"


async def test_a_harmless_xid_is_an_informational_taint_and_goes_after_the_quiet_period(
    short_dir: Path,
) -> None:
    async with node("pcie-a10", short_dir) as n:
        with capture_logs() as logs:
            n.fake.push_xid(1, 13)
            taints = await n.wait_taints(lambda t: t["gpu-1"])
        assert taints["gpu-1"] == [{"key": XID, "value": "13", "effect": "None"}]
        assert n.device_health("gpu-1") == "Healthy"
        assert any(e["event"] == "device_taints_changed" for e in logs)
        await n.wait_taints(lambda t: not t["gpu-1"])


async def test_a_harmless_xid_never_hides_a_counted_one(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir) as n:
        n.fake.push_xid(0, 79)
        await n.wait_taints(lambda t: t["gpu-0"])
        n.fake.push_xid(0, 13)
        n.fake.push_xid(1, 94)  # a marker event after the harmless one
        await n.wait_taints(lambda t: t["gpu-1"])
        assert n.taints()["gpu-0"] == [{"key": XID, "value": "79", "effect": "NoSchedule"}]


async def test_additional_xids_to_ignore_are_informational(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir, additional_xids_to_ignore="94, 95") as n:
        n.fake.push_xid(0, 94)
        taints = await n.wait_taints(lambda t: t["gpu-0"])
        assert taints["gpu-0"] == [{"key": XID, "value": "94", "effect": "None"}]
        assert n.device_health("gpu-0") == "Healthy"


async def test_a_lost_gpu_is_tainted_gpu_lost_for_good(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir) as n:
        n.fake.lose_gpu(1)
        taints = await n.wait_taints(lambda t: any(x["key"] == f"{DRIVER}/gpu-lost" for x in t["gpu-1"]))
        assert {"key": f"{DRIVER}/gpu-lost", "effect": "NoSchedule"} in taints["gpu-1"]
        await n.wait_health(lambda h: h.get("gpu-1") == "Unhealthy")
        # The failed wait made every device Unhealthy for a while (recoverable); GPU 0 recovers.
        await n.wait_taints(lambda t: not t["gpu-0"])
        assert {"key": f"{DRIVER}/gpu-lost", "effect": "NoSchedule"} in n.taints()["gpu-1"]


async def test_gpus_without_health_events_are_unmonitored(short_dir: Path) -> None:
    async with node("legacy-k80", short_dir) as n:
        taints = await n.wait_taints(lambda t: all(t.values()))
        assert taints == {
            name: [{"key": f"{DRIVER}/unmonitored", "effect": "None"}] for name in ("gpu-0", "gpu-1")
        }
        await n.wait_health(lambda h: h == {"gpu-0": "Healthy", "gpu-1": "Healthy"})


async def test_an_xid_on_one_mig_instance_taints_that_mig_device_only(short_dir: Path) -> None:
    async with node("mig-mixed", short_dir) as n:
        record = next(r for r in n.plugin.records if r.mig is not None and r.mig.parent_minor == 1)
        assert record.mig is not None
        name = str(next(d.name for d in n.plugin.devices if d.id == record.uuid))
        n.fake.push_xid(
            1,
            94,
            gpu_instance_id=record.mig.gpu_instance_id,
            compute_instance_id=record.mig.compute_instance_id,
        )
        taints = await n.wait_taints(lambda t: t[name])
        assert taints[name] == [{"key": XID, "value": "94", "effect": "NoSchedule"}]
        assert [d for d, t in taints.items() if t] == [name]
        health = await n.wait_health(lambda h: h.get(name) == "Unhealthy")
        assert [d for d, s in health.items() if s != "Healthy"] == [name]


@pytest.mark.parametrize(
    ("gates", "enabled"),
    [
        (None, True),
        ("", True),
        ({}, True),
        ("NVMLDeviceHealthCheck=true", True),
        ("MPSSupport=true", True),
        ("NVMLDeviceHealthCheck=false", False),
        (" NVMLDeviceHealthCheck = false ,MPSSupport=true", False),
        ("AllAlpha=false", False),
        ("AllAlpha=false,NVMLDeviceHealthCheck=true", True),
        ("DynamicMIG=true", False),
        ({"NVMLDeviceHealthCheck": False}, False),
        (SimpleNamespace(NVMLDeviceHealthCheck=False), False),
    ],
)
def test_the_feature_gate_turns_health_off_only_explicitly(gates: Any, enabled: bool) -> None:
    assert health_enabled(SimpleNamespace(feature_gates=gates)) is enabled


def test_no_monitor_when_the_gate_is_off() -> None:
    off = SimpleNamespace(feature_gates="NVMLDeviceHealthCheck=false")
    assert dra_health_monitor(off, [object()], DRIVER) is None  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, set()),
        ("", set()),
        ("94", {94}),
        (" 94 , abc,,-3, 95", {94, 95}),
        ((63, 64), {63, 64}),
    ],
)
def test_additional_xids_are_parsed_as_nvidia_parses_them(value: Any, expected: set[int]) -> None:
    assert additional_ignored(SimpleNamespace(additional_xids_to_ignore=value)) == expected


@pytest.mark.parametrize("api", ["device-plugin", "dra"])
async def test_in_a_container_health_checks_load_the_driver_where_discovery_does(
    tmp_path: Path, api: str
) -> None:
    """The DaemonSets run with --driver-root the host's path and the host's driver root mounted
    at --driver-root-ctr-path: the health checks open NVML there, as discovery does. (They used
    the host's path, absent in the container: every GPU Unhealthy with check_not_running and
    tainted, seen with deploy/nvidia-dra on a real node.)"""
    from devplug_nvidia._cli._main import health_monitor
    from devplug_nvidia.discovery import discover

    root = write_root(MODELS["pcie-a10"], tmp_path / "root")
    config = NvidiaSettings(
        fake_nvml="pcie-a10", driver_root="/run/no-such-driver-root", driver_root_ctr_path=str(root)
    )
    records = [r for found in discover(config).values() for r in found]
    assert len(records) == 4
    monitor = (
        health_monitor(config, records)
        if api == "device-plugin"
        else dra_health_monitor(config, records, DRIVER)
    )
    assert monitor is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        with anyio.fail_after(10):
            await monitor.wait_started()
        # A failed first check would turn them Unhealthy at once.
        await never_within(
            lambda: {monitor.health(r.uuid).value for r in records} != {"Healthy"},
            0.3,
            what="a GPU unhealthy",
        )
        tg.cancel_scope.cancel()
