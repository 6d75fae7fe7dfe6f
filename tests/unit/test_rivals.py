"""Two servers of one resource in one directory: each notices the other's socket, once."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DevicePlugin
from devplug.testing import FakeKubelet, serving
from tests.support import wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/twice"


class Twice(DevicePlugin):
    resource_name = RESOURCE

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        yield [Device(id="d0")]
        await anyio.sleep_forever()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation()


def rivals(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] == "another_plugin_socket"]


async def test_the_replaced_plugin_names_the_other_socket(fake_kubelet: FakeKubelet) -> None:
    dp = fake_kubelet.device_plugin_dir
    # A dead socket left by a crashed predecessor is no rival.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(dp / "example.com-twice-00000000.sock"))
    stale.close()
    with capture_logs() as logs:
        async with serving(Twice(), fake_kubelet):
            first = await fake_kubelet.wait_for_registration(RESOURCE)
            async with serving(Twice(), fake_kubelet):
                second = await fake_kubelet.wait_for_registration(RESOURCE, count=2)
                await wait_until(lambda: len(rivals(logs)) >= 2, timeout=10)
                old = [e for e in rivals(logs) if e["other_socket"] == second.endpoint]
                new = [e for e in rivals(logs) if e["other_socket"] == first.endpoint]
                # The first server saw the second appear; the second found the first serving.
                assert len(old) == 1 and len(new) == 1, rivals(logs)
                assert old[0]["log_level"] == "warning"
                assert old[0]["resource"] == RESOURCE
    assert all(e["other_socket"] != "example.com-twice-00000000.sock" for e in rivals(logs))
    assert Path(dp / "example.com-twice-00000000.sock").exists()  # not ours to remove
