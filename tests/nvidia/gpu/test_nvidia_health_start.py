"""A health monitor that cannot start says so and marks the devices Unhealthy; it keeps trying."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug_nvidia._gpu._xids import XidFilter
from devplug_nvidia.testing import fake_nvml
from tests.nvidia.nvidia_health_kit import monitoring
from tests.support import wait_until

pytestmark = pytest.mark.anyio

GPU = "nvidia.com/gpu"
NO_PERMISSION, UNKNOWN, DRIVER_NOT_LOADED = 4, 999, 9


async def test_nvml_that_cannot_start_marks_every_device_unhealthy(tmp_path: Path) -> None:
    broken = fake_nvml("pcie-a10", init_error=DRIVER_NOT_LOADED)
    with capture_logs() as logs:
        async with monitoring("pcie-a10", tmp_path, module=broken) as m:
            assert m.unhealthy() == {r.uuid for r in m.records}
            await anyio.sleep(0.3)  # retried, still failing, still Unhealthy
            assert m.unhealthy() == {r.uuid for r in m.records}
    failures = [e for e in logs if e["event"] == "health_check_start_failed"]
    assert len(failures) >= 2 and failures[0]["log_level"] == "error"
    assert "kernel driver is not loaded" in failures[0]["error"]
    assert failures[0]["marked"] == "Unhealthy" and len(failures[0]["devices"]) == 4


async def test_event_set_failure_then_a_later_start_recovers(tmp_path: Path) -> None:
    fake = fake_nvml("pcie-a10")
    fake.fail("nvmlEventSetCreate", UNKNOWN)
    async with monitoring("pcie-a10", tmp_path, module=fake) as m:
        assert len(m.unhealthy()) == 4
        # The retry (0.2 s later) starts; the devices are Healthy after the quiet period.
        await wait_until(lambda: not m.unhealthy())
        fake.push_xid(1, 94)
        await wait_until(lambda: len(m.unhealthy()) == 1)


async def test_one_gpu_that_cannot_register_is_unhealthy_until_it_can(tmp_path: Path) -> None:
    fake = fake_nvml("pcie-a10")
    fake.fail("nvmlDeviceRegisterEvents", NO_PERMISSION)
    with capture_logs() as logs:
        async with monitoring("pcie-a10", tmp_path, module=fake) as m:
            first = m.resources[GPU][0].uuid
            assert m.unhealthy() == {first}
            await wait_until(lambda: not m.unhealthy())
            assert fake.push_xid(0, 94) == 1  # registered by the retry
    failed = [e for e in logs if e["event"] == "health_check_start_failed"]
    assert failed[0]["devices"] == [first] and "Insufficient Permissions" in failed[0]["error"]


async def test_lost_at_start_is_fatal(tmp_path: Path) -> None:
    fake = fake_nvml("pcie-a10")
    fake.devices[2].lost = True
    async with monitoring("pcie-a10", tmp_path, module=fake) as m:
        lost = m.resources[GPU][2].uuid
        assert m.unhealthy() == {lost}
        await anyio.sleep(0.4)
        assert m.unhealthy() == {lost}


async def test_disabled_health_checks_never_open_nvml(tmp_path: Path) -> None:
    fake = fake_nvml("pcie-a10")
    with capture_logs() as logs:
        async with monitoring("pcie-a10", tmp_path, module=fake, xids=XidFilter(disabled="all")) as m:
            await anyio.sleep(0.1)
            assert not m.unhealthy()
    assert "nvmlEventSetCreate" not in fake.calls and fake.calls == []
    assert [e["event"] for e in logs] == ["health_checks_disabled"]


async def test_enabled_xids_with_all_disabled_still_watch_those(tmp_path: Path) -> None:
    xids = XidFilter(disabled="all", enabled=frozenset({31}))
    async with monitoring("pcie-a10", tmp_path, xids=xids) as m:
        m.fake.push_xid(0, 79)
        await anyio.sleep(0.15)
        assert not m.unhealthy()
        m.fake.push_xid(0, 31)
        await wait_until(lambda: m.unhealthy() == {m.resources[GPU][0].uuid})


async def test_wait_errors_in_a_row_make_a_new_event_set(tmp_path: Path) -> None:
    async with monitoring("pcie-a10", tmp_path, wait_timeout=0.01) as m:
        with capture_logs() as logs:
            for _ in range(5):
                m.fake.push_error(UNKNOWN)
            await wait_until(lambda: any(e["event"] == "health_check_started" for e in logs))
        assert any(e["event"] == "event_set_reopened" for e in logs)
        assert len(m.fake._sets()) == 1
        await wait_until(lambda: not m.unhealthy())
        m.fake.push_xid(3, 94)
        await wait_until(lambda: m.unhealthy() == {m.resources[GPU][3].uuid})


async def test_event_types_from_the_config_limit_what_is_registered(tmp_path: Path) -> None:
    xids = XidFilter(event_types=("EventTypeXidCriticalError",))
    async with monitoring("pcie-a10", tmp_path, xids=xids) as m:
        assert m.fake.push_ecc(0) == 0  # double-bit ECC not registered
        assert m.fake.push_xid(0, 94) == 1
        await wait_until(lambda: m.unhealthy() == {m.resources[GPU][0].uuid})
