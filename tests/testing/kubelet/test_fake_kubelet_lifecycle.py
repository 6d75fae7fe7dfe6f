"""FakeKubelet start, stop and restart: what happens to the files, the resources and the plugins."""

from __future__ import annotations

import socket
import stat
from typing import TYPE_CHECKING

import anyio
import pytest
from asyncinotify import Inotify, Mask

from devplug.testing import FakeKubelet
from tests.support import wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from conftest import RawPlugin

    MakePlugin = Callable[..., Awaitable[RawPlugin]]

pytestmark = pytest.mark.anyio

RESOURCE = "example.com/widget"


def stale_socket(path: Path) -> None:
    """Leave a socket file behind, as a crashed process would."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


async def test_start_cleans_the_directory_like_a_starting_kubelet(short_dir: Path) -> None:
    directory = short_dir / "dp"
    directory.mkdir()
    (directory / "kubelet_internal_checkpoint").write_text("{}")
    (directory / "notes.txt").write_text("kept")
    (directory / "sub").mkdir()
    stale_socket(directory / "old-plugin.sock")
    stale_socket(directory / "kubelet.sock")

    async with FakeKubelet(directory) as kubelet:
        names = sorted(p.name for p in directory.iterdir())
        assert names == ["kubelet.sock", "kubelet_internal_checkpoint", "notes.txt", "sub"]
        assert stat.S_ISSOCK(kubelet.socket_path.stat().st_mode)
    assert not kubelet.socket_path.exists()
    assert (directory / "kubelet_internal_checkpoint").read_text() == "{}"


async def test_start_creates_missing_directories(short_dir: Path) -> None:
    async with FakeKubelet(short_dir / "a" / "dp", plugins_registry_dir=short_dir / "a" / "reg") as kubelet:
        assert kubelet.socket_path.exists()
        assert (short_dir / "a" / "reg").is_dir()


async def test_stop_is_idempotent_and_ends_plugin_streams(short_dir: Path, make_plugin: MakePlugin) -> None:
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    plugin = await make_plugin(kubelet.device_plugin_dir / "w.sock", RESOURCE)
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_devices(RESOURCE)

    await kubelet.stop()
    await kubelet.stop()
    assert not kubelet.socket_path.exists()
    assert not kubelet.resource(RESOURCE).connected
    await wait_until(lambda: plugin.streams_closed > 0)


async def test_restart_deletes_plugin_sockets_and_recreates_kubelet_sock(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        directory = kubelet.device_plugin_dir
        (directory / "kubelet_internal_checkpoint").write_text("{}")
        plugin = await make_plugin(directory / "w.sock", RESOURCE)
        await plugin.register(kubelet.socket_path)
        await kubelet.wait_for_devices(RESOURCE)

        events: list[tuple[str, Mask]] = []
        with Inotify() as inotify:
            inotify.add_watch(directory, Mask.CREATE | Mask.DELETE)
            await kubelet.restart(downtime=0.05)
            with anyio.move_on_after(0.5):
                async for event in inotify:
                    assert event.name is not None
                    events.append((str(event.name), event.mask & (Mask.CREATE | Mask.DELETE)))
                    if (str(event.name), event.mask & Mask.CREATE) == ("kubelet.sock", Mask.CREATE):
                        break

        # kubelet.sock deleted, the plugin's socket deleted, then a new kubelet.sock created:
        # what plugins watch for. (The new file may reuse the old inode number.)
        assert events.index(("kubelet.sock", Mask.DELETE)) < events.index(("kubelet.sock", Mask.CREATE))
        assert ("w.sock", Mask.DELETE) in events
        assert not plugin.socket.exists()
        assert (directory / "kubelet_internal_checkpoint").read_text() == "{}"
        assert kubelet.resources == {}
        assert len(kubelet.registrations) == 1
        assert kubelet.allocatable(RESOURCE) == 0
        await wait_until(lambda: plugin.streams_closed > 0)

        # The plugin must register again, on a new socket.
        again = await make_plugin(directory / "w2.sock", RESOURCE)
        await again.register(kubelet.socket_path)
        assert (await kubelet.wait_for_registration(RESOURCE, count=2)).endpoint == "w2.sock"
        await kubelet.wait_for_devices(RESOURCE)


async def test_restart_works_from_inside_a_task_group(short_dir: Path) -> None:
    # The kubelet's tasks do not live in the caller's cancel scopes.
    kubelet = FakeKubelet(short_dir / "dp")
    await kubelet.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(kubelet.restart)
    async with anyio.create_task_group() as tg:
        tg.start_soon(kubelet.stop)
    assert not kubelet.socket_path.exists()


async def test_cancelled_while_it_starts_it_stops_cleanly(short_dir: Path) -> None:
    """A cancellation at any moment of the start (a Ctrl-C ending `devplug demo`) leaves no
    error and no kubelet.sock. Cancelled while its gRPC server started, it used to fail with
    InvalidStateError ("invalid state") in the stop that followed."""
    directory = short_dir / "dp"
    began = anyio.current_time()
    async with FakeKubelet(directory):
        pass
    took = anyio.current_time() - began
    for step in range(200):  # moments spread over the whole start, twice
        with anyio.move_on_after(took * (step % 100) / 100):
            async with FakeKubelet(directory):
                pass
        assert not (directory / "kubelet.sock").exists(), step


async def test_start_twice_is_an_error(short_dir: Path) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        with pytest.raises(RuntimeError, match="already running"):
            await kubelet.start()


def test_socket_paths_longer_than_af_unix_allows_are_refused(short_dir: Path) -> None:
    with pytest.raises(ValueError, match="at most 107"):
        FakeKubelet(short_dir / ("d" * 100))
    with pytest.raises(ValueError, match="at most 107"):
        FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / ("r" * 100))


async def test_fake_kubelet_fixture(fake_kubelet: FakeKubelet) -> None:
    assert fake_kubelet.socket_path.exists()
    assert fake_kubelet.device_plugin_dir.name == "device-plugins"
    assert fake_kubelet.plugins_registry_dir is not None
    assert fake_kubelet.plugins_registry_dir.name == "plugins_registry"
    assert fake_kubelet.plugins_registry_dir.is_dir()
    assert fake_kubelet.sync_register
