"""Two servers of one resource in one directory: each notices the other's socket, once."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DevicePlugin
from devplug.testing import FakeKubelet, serving
from tests.support import never_within, wait_until

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


def accepted(kubelet: FakeKubelet) -> list[str]:
    """The endpoints of the resource's accepted registrations, in order (file names)."""
    return [Path(r.endpoint).name for r in kubelet.registrations if r.accepted and r.resource == RESOURCE]


@asynccontextmanager
async def stoppable(kubelet: FakeKubelet, registration: str) -> AsyncIterator[anyio.Event]:
    """A copy of the plugin served until the event yielded is set (or the block ends)."""
    stop = anyio.Event()

    async def serve() -> None:
        async with serving(Twice(), kubelet, registration=registration):
            await stop.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        yield stop
        stop.set()


@pytest.mark.parametrize("registration", ["kubelet", "watcher"])
async def test_the_replaced_plugin_registers_again_when_the_other_stops(
    fake_kubelet: FakeKubelet, registration: str
) -> None:
    with capture_logs() as logs:
        async with stoppable(fake_kubelet, registration):
            await wait_until(lambda: len(accepted(fake_kubelet)) == 1, what="the first registration")
            async with stoppable(fake_kubelet, registration) as second:
                await wait_until(lambda: len(accepted(fake_kubelet)) == 2, what="the second registration")
                second.set()  # the copy the kubelet took the resource over to stops
            await wait_until(
                lambda: len(accepted(fake_kubelet)) == 3, timeout=10, what="a third registration"
            )
            old, other, new = accepted(fake_kubelet)
            assert new not in (old, other)
            await fake_kubelet.wait_for_devices(RESOURCE, lambda ds: bool(ds) and all(d.healthy for d in ds))
            assert Path(fake_kubelet.resource(RESOURCE).endpoint).name == new
    assert len([e for e in logs if e["event"] == "rival_stopped"]) == 1


async def test_the_newer_plugin_keeps_its_registration_when_the_older_stops(
    fake_kubelet: FakeKubelet,
) -> None:
    """A rolling update: the old copy stops once the new one took over, and nothing restarts."""
    async with stoppable(fake_kubelet, "kubelet") as older:
        await wait_until(lambda: len(accepted(fake_kubelet)) == 1, what="the first registration")
        async with stoppable(fake_kubelet, "kubelet"):
            await wait_until(lambda: len(accepted(fake_kubelet)) == 2, what="the second registration")
            older.set()
            first = accepted(fake_kubelet)[0]
            await wait_until(
                lambda: not (fake_kubelet.device_plugin_dir / first).exists(), what="the old one gone"
            )
            await never_within(lambda: len(accepted(fake_kubelet)) > 2, 1.0, what="a registration again")
            assert fake_kubelet.resource(RESOURCE).devices


async def test_a_copy_that_appears_while_register_is_answered_is_a_successor(
    fake_kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another copy's socket appears as the kubelet answers this copy's Register: that copy
    registers after this one. (It used to be counted as a predecessor, taken for present
    before the registration, and its end never led to registering again.)"""
    import devplug._device_plugin.resource as resource_module

    real_register = resource_module.register
    rival_path = fake_kubelet.device_plugin_dir / "example.com-twice-0badc0de.sock"
    rival = socket.socket(socket.AF_UNIX)

    async def register_then_a_rival_appears(*args: object, **kwargs: object) -> None:
        await real_register(*args, **kwargs)  # type: ignore[arg-type]
        if not rival_path.exists():
            rival.bind(str(rival_path))
            rival.listen()

    monkeypatch.setattr(resource_module, "register", register_then_a_rival_appears)
    with capture_logs() as logs:
        async with serving(Twice(), fake_kubelet):
            await wait_until(rival_path.exists, what="the other copy's socket")
            rival.close()
            rival_path.unlink()  # the copy that took the resource over stops
            await wait_until(lambda: len(accepted(fake_kubelet)) == 2, timeout=10, what="a new registration")
    assert [e["event"] for e in logs if e["event"] == "rival_stopped"] == ["rival_stopped"]
