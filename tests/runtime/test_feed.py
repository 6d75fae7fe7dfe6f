"""The device feed's ``no_devices_listed`` warning: once per stretch without a device in force."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DevicePlugin
from devplug._runtime.feed import feed_devices
from tests.support import never_within, wait_until

pytestmark = pytest.mark.anyio


class Scripted(DevicePlugin):
    """Yields the lists it is sent, one at a time."""

    resource_name = "example.com/scripted"

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Sequence[Device]](10)

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        async for devices in self.receive:
            yield devices

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation()


def warnings(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] == "no_devices_listed"]


async def test_no_devices_is_warned_once_per_stretch() -> None:
    plugin = Scripted()
    published: list[int] = []

    async def publish(devices: tuple[Device, ...]) -> int:
        published.append(len(devices))
        return len(devices)

    log = structlog.get_logger("test")
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: feed_devices(plugin, publish, log, warn_after=0.05))
            await plugin.send.send([])  # an empty list is still no device in force
            await wait_until(lambda: warnings(logs))
            first = warnings(logs)[0]
            assert first["log_level"] == "warning"
            assert first["resource"] == "example.com/scripted"
            assert first["seconds"] == 0.05
            # Many times the delay later, still the one warning.
            await never_within(lambda: len(warnings(logs)) > 1, 0.3, what="a second warning")
            # Devices came: nothing to say, however long they stay.
            await plugin.send.send([Device(id="a")])
            await wait_until(lambda: published[-1:] == [1])
            await never_within(lambda: len(warnings(logs)) > 1, 0.3, what="a warning with devices")
            # Gone again: a new stretch, a new warning.
            await plugin.send.send([])
            await wait_until(lambda: len(warnings(logs)) == 2)
            tg.cancel_scope.cancel()


async def test_a_plugin_that_never_lists_is_warned_about() -> None:
    class Silent(Scripted):
        async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
            await anyio.sleep_forever()
            yield []

    async def publish(devices: tuple[Device, ...]) -> int:
        return len(devices)

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: feed_devices(Silent(), publish, structlog.get_logger(), warn_after=0.05))
            await wait_until(lambda: warnings(logs))
            tg.cancel_scope.cancel()
