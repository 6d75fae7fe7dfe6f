"""Health from NVML events: XIDs, ECC, wait errors, lost GPUs, recovery, through watch_devices."""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import Device, Health
from devplug_nvidia import NvidiaSettings
from devplug_nvidia.plugin import NvidiaPlugin
from tests.nvidia.nvidia_health_kit import COOLDOWN, Monitored, monitoring
from tests.support import never_within, wait_until

pytestmark = pytest.mark.anyio

GPU = "nvidia.com/gpu"
NVML_ERROR_UNKNOWN = 999
RECOVERABLE_XID = 94  # contained ECC error: restart the application, the GPU is fine


def plugin_of(m: Monitored, resource: str = GPU, **kw: object) -> NvidiaPlugin:
    return NvidiaPlugin(resource, m.resources[resource], NvidiaSettings(), health=m.monitor, **kw)  # type: ignore[arg-type]


async def next_list(watch: AsyncGenerator[Sequence[Device], None], within: float = 3.0) -> list[Device]:
    with anyio.fail_after(within):
        return list(await anext(watch))


def unhealthy_ids(devices: Sequence[Device]) -> list[str]:
    return [d.id for d in devices if d.health is Health.UNHEALTHY]


async def test_recoverable_xid_marks_one_gpu_then_it_recovers(tmp_path: Path) -> None:
    async with monitoring("dgx-a100", tmp_path) as m:
        watch = plugin_of(m).watch_devices()
        first = await next_list(watch)
        assert len(first) == 8 and not unhealthy_ids(first)
        assert m.fake.push_xid(2, RECOVERABLE_XID) == 1
        started = anyio.current_time()
        second = await next_list(watch)
        assert unhealthy_ids(second) == [m.resources[GPU][2].uuid]
        third = await next_list(watch)
        assert not unhealthy_ids(third)
        # Healthy again only after the quiet period.
        assert anyio.current_time() - started >= COOLDOWN * 0.9
        await watch.aclose()


async def test_another_xid_restarts_the_quiet_period(tmp_path: Path) -> None:
    async with monitoring("pcie-a10", tmp_path) as m:
        gpu = m.resources[GPU][1].uuid
        m.fake.push_xid(1, RECOVERABLE_XID)
        await wait_until(lambda: m.unhealthy() == {gpu})
        await anyio.sleep(COOLDOWN * 0.6)
        m.fake.push_xid(1, 62)
        # Still unhealthy 1.2 cooldowns after the first XID, 0.6 after the second.
        await never_within(lambda: m.unhealthy() != {gpu}, COOLDOWN * 0.6, what="recovered")
        await wait_until(lambda: not m.unhealthy())


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
async def test_ignored_xids_change_nothing(tmp_path: Path, xid: int) -> None:
    async with monitoring("pcie-a10", tmp_path) as m:
        version = m.monitor.version
        with capture_logs() as logs:
            m.fake.push_xid(0, xid)
            await wait_until(lambda: any(e["event"] == "xid_ignored" for e in logs))
        assert m.monitor.version == version and not m.unhealthy()
        assert [e["xid"] for e in logs if e["event"] == "xid_ignored"] == [xid]


@pytest.mark.parametrize("xid", [48, 79, 95, 119])
async def test_fatal_xids_never_recover(tmp_path: Path, xid: int) -> None:
    async with monitoring("pcie-a10", tmp_path) as m:
        gpu = m.resources[GPU][3].uuid
        m.fake.push_xid(3, xid)
        await wait_until(lambda: m.unhealthy() == {gpu})
        await never_within(lambda: m.unhealthy() != {gpu}, COOLDOWN * 2, what="recovered")
        assert m.monitor.fatal_reason(gpu) == f"XID {xid}"


async def test_double_bit_ecc_is_fatal_single_bit_is_only_logged(tmp_path: Path) -> None:
    async with monitoring("pcie-a10", tmp_path) as m:
        with capture_logs() as logs:
            m.fake.push_ecc(0, double_bit=False)
            await wait_until(lambda: any(e["event"] == "ecc_single_bit" for e in logs))
        assert not m.unhealthy()
        m.fake.push_ecc(1)
        gpu = m.resources[GPU][1].uuid
        await wait_until(lambda: m.unhealthy() == {gpu})
        await never_within(
            lambda: m.monitor.fatal_reason(gpu) != "double-bit ECC error", COOLDOWN * 2, what="not fatal"
        )


async def test_wait_error_marks_every_device_then_waiting_goes_on(tmp_path: Path) -> None:
    async with monitoring("dgx-a100", tmp_path) as m:
        watch = plugin_of(m).watch_devices()
        await next_list(watch)
        with capture_logs() as logs:
            m.fake.push_error(NVML_ERROR_UNKNOWN)
            assert len(unhealthy_ids(await next_list(watch))) == 8
        assert [e["error"] for e in logs if e["event"] == "event_wait_failed"]
        assert not unhealthy_ids(await next_list(watch))  # all back after the quiet period
        # Still watching: a new XID is seen.
        m.fake.push_xid(5, RECOVERABLE_XID)
        assert unhealthy_ids(await next_list(watch)) == [m.resources[GPU][5].uuid]
        await watch.aclose()


async def test_lost_gpu_stays_unhealthy_the_others_recover(tmp_path: Path) -> None:
    async with monitoring("dgx-h100", tmp_path) as m:
        lost = m.resources[GPU][3].uuid
        watch = plugin_of(m).watch_devices()
        await next_list(watch)
        m.fake.lose_gpu(3)
        assert len(unhealthy_ids(await next_list(watch))) == 8
        assert unhealthy_ids(await next_list(watch)) == [lost]
        assert m.monitor.fatal_reason(lost) == "GPU lost (fallen off the bus)"
        await anyio.sleep(COOLDOWN * 2)
        assert m.unhealthy() == {lost}
        await watch.aclose()


async def test_an_xid_reaches_every_replica_of_its_gpu(tmp_path: Path) -> None:
    async with monitoring("pcie-a10", tmp_path) as m:
        records = m.resources[GPU]
        plugin = plugin_of(m, replicas={r.uuid: 3 for r in records})
        watch = plugin.watch_devices()
        assert len(await next_list(watch)) == 12
        m.fake.push_xid(2, RECOVERABLE_XID)
        bad = unhealthy_ids(await next_list(watch))
        assert bad == [f"{records[2].uuid}::{n}" for n in range(3)]
        await watch.aclose()


# mig-mixed GPU 2: GI 1 = 3g.20gb split into CI 0 (1 slice) and CI 1 (2 slices); GI 5 = 2g.10gb;
# GI 13 = 1g.10gb. GPU 0: seven 1g.5gb, GIs 7..13.
@pytest.mark.parametrize(
    ("gi", "ci", "expected"),
    [
        (1, 0, {"mig-1c.3g.20gb"}),
        (1, 1, {"mig-2c.3g.20gb"}),
        (1, 0xFFFFFFFF, {"mig-1c.3g.20gb", "mig-2c.3g.20gb"}),
        (5, 0, {"mig-2g.10gb"}),
        (0xFFFFFFFF, 0xFFFFFFFF, {"mig-1c.3g.20gb", "mig-2c.3g.20gb", "mig-2g.10gb", "mig-1g.10gb"}),
        (9, 0, set()),
    ],
)
async def test_mig_events_match_by_gpu_and_compute_instance(
    tmp_path: Path, gi: int, ci: int, expected: set[str]
) -> None:
    async with monitoring("mig-mixed", tmp_path, "mixed") as m:
        m.fake.push_xid(2, RECOVERABLE_XID, gpu_instance_id=gi, compute_instance_id=ci)
        by_uuid = {r.uuid: name for name, rs in m.resources.items() for r in rs}
        if expected:
            await wait_until(lambda: bool(m.unhealthy()))
        else:
            await anyio.sleep(0.2)
        assert {by_uuid[u].removeprefix("nvidia.com/") for u in m.unhealthy()} == expected
        # Nothing on another GPU is touched.
        assert all(r.mig is None or r.mig.parent_index == 2 for r in m.records if r.uuid in m.unhealthy())


async def test_an_event_on_a_mig_gpu_reaches_every_mig_device_on_it(tmp_path: Path) -> None:
    async with monitoring("mig-uniform", tmp_path, "single") as m:
        records = m.resources[GPU]
        watch = plugin_of(m).watch_devices()
        assert len(await next_list(watch)) == 14
        m.fake.push_xid(1, RECOVERABLE_XID)
        bad = unhealthy_ids(await next_list(watch))
        assert bad == [r.uuid for r in records if r.mig is not None and r.mig.parent_index == 1]
        assert len(bad) == 7
        await watch.aclose()


async def test_none_strategy_full_gpu_with_mig_on_takes_its_instances_events(tmp_path: Path) -> None:
    async with monitoring("mig-uniform", tmp_path, "none") as m:
        m.fake.push_xid(0, RECOVERABLE_XID, gpu_instance_id=7, compute_instance_id=0)
        await wait_until(lambda: m.unhealthy() == {m.resources[GPU][0].uuid})


async def test_gpus_without_event_support_are_skipped_not_unhealthy(tmp_path: Path) -> None:
    with capture_logs() as logs:
        async with monitoring("legacy-k80", tmp_path) as m:
            plugin = plugin_of(m)
            watch = plugin.watch_devices()
            assert not unhealthy_ids(await next_list(watch))
            assert m.fake.push_xid(0, 79) == 0  # nothing registered, nothing delivered
            await anyio.sleep(0.2)
            assert not m.unhealthy()
            await watch.aclose()
    skipped = [e for e in logs if e["event"] == "health_events_not_supported"]
    assert sorted(e["gpu"] for e in skipped) == sorted(r.uuid for r in m.records)
    assert not [e for e in logs if e["event"] == "health_check_start_failed"]


def waiting_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvml-event-wait" and t.is_alive()]


async def test_cancelling_the_monitor_is_prompt_and_frees_the_event_set(tmp_path: Path) -> None:
    async with monitoring("pcie-a10", tmp_path, wait_timeout=2.0) as m:
        # The event loop keeps running while a wait blocks in its thread.
        started = anyio.current_time()
        for _ in range(20):
            await anyio.sleep(0.005)
        assert anyio.current_time() - started < 0.5
        assert m.fake._sets()
        await wait_until(lambda: bool(waiting_threads()), what="a wait in its thread")
        # A daemon: the interpreter does not join it at exit (SIGTERM ends the process at once).
        assert all(t.daemon for t in waiting_threads())
    # The stop did not wait for the wait (2 s, no event comes): its thread still waits, and frees
    # the event set when its wait returns.
    assert waiting_threads()
    await wait_until(lambda: not m.fake._sets(), timeout=10, what="the event set freed")


async def test_flapping_gpu_is_held_by_the_policy(tmp_path: Path) -> None:
    async with monitoring("pcie-a10", tmp_path, cooldown=0.05, flap_limit=2, flap_hold=60) as m:
        gpu = m.resources[GPU][0].uuid
        m.fake.push_xid(0, RECOVERABLE_XID)
        await wait_until(lambda: m.unhealthy() == {gpu})
        await wait_until(lambda: not m.unhealthy())
        with capture_logs() as logs:
            m.fake.push_xid(0, RECOVERABLE_XID)
            await wait_until(lambda: m.unhealthy() == {gpu})
            await never_within(lambda: m.unhealthy() != {gpu}, 0.3, what="recovered while flapping")
        assert any("flapping" in e.get("reason", "") for e in logs)
