"""run_conformance from pytest, and what the fake kubelet records for it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import anyio
import pytest

from devplug.testing import CHECKS, ConformanceReport, FakeKubelet, run_conformance

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from conftest import RawPlugin

    MakePlugin = Callable[..., Awaitable[RawPlugin]]

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/widget"


async def test_run_conformance_on_devplug_fake() -> None:
    command = [sys.executable, "-m", "devplug_fake", "--device-plugin-dir={dir}", "--count", "2"]
    report = await run_conformance(command, restarts=1)
    assert isinstance(report, ConformanceReport)
    assert report.passed, report.failures
    assert report.resource == "example.com/fake"
    assert [r.name for r in report.results] == list(CHECKS)
    assert report.command[-3].startswith("--device-plugin-dir=/tmp/dpc-")  # {dir} substituted
    assert report.result("preferred_allocation").status == "skip"
    assert (
        report.result("full_lists_only").reason == "2 messages on 2 streams, each listing the same 2 devices"
    )
    with pytest.raises(KeyError):
        report.result("no_such_check")


async def test_run_conformance_refuses_an_empty_command() -> None:
    with pytest.raises(ValueError, match="no command"):
        await run_conformance([])


async def test_registration_records_whether_the_endpoint_was_serving(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        early = await make_plugin(kubelet.device_plugin_dir / "early.sock", RESOURCE)
        await early.register(kubelet.socket_path)
        assert kubelet.registrations[-1].serving_at_register is True

        # Register first and serve a moment later: the kubelet's blocking dial-back still
        # connects, so the registration is accepted, but the record says what happened.
        late = await make_plugin(kubelet.device_plugin_dir / "late.sock", "example.com/late", serve=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(late.register, kubelet.socket_path)
            await anyio.sleep(0.2)
            await late.start()
        registration = kubelet.registrations[-1]
        assert registration.accepted and registration.serving_at_register is False


async def test_stream_timing_is_recorded(short_dir: Path, make_plugin: MakePlugin) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        plugin = await make_plugin(kubelet.device_plugin_dir / "w.sock", RESOURCE)
        await plugin.register(kubelet.socket_path)
        await kubelet.wait_for_devices(RESOURCE)
        view = kubelet.resource(RESOURCE)
        plugin.set_devices([("a", "Healthy", ())])
        await kubelet.wait_for_devices(RESOURCE, lambda ds: [d.id for d in ds] == ["a"])
        assert len(view.received_at) == view.messages == 2
        assert view.connected_at <= view.received_at[0] <= view.received_at[1]
