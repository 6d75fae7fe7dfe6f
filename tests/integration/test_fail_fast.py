"""What no retry can mend stops the process at once, with one line and status 2: a socket
directory it may not write to, a second copy of a DRA driver on the same sockets."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from devplug import ConfigError, Device, Runner, Settings
from devplug.dra import DraDriver
from devplug.testing import FakeKubeAPI, FakeKubelet
from tests.dra.dra_kit import NODE
from tests.support import ROOT, Widgets, logged_process, settings_for, wait_until

pytestmark = pytest.mark.anyio
DRIVER = "fake.example.com"


@contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """``directory`` refuses new files even to root (``chattr +i``) while the block runs."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("needs chattr")
    done = subprocess.run([chattr, "+i", str(directory)], capture_output=True, check=False)
    try:
        if done.returncode != 0 or os.access(directory, os.W_OK):
            pytest.skip("needs chattr +i: root, on a filesystem that supports it")
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], capture_output=True, check=False)


async def finished(*args: str) -> tuple[int, list[str]]:
    """Run ``python -m ARGS`` to its end (60 s at most): its status and its stderr lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-m", *args], cwd=ROOT, env=env, check=False)
    return done.returncode, done.stderr.decode().splitlines()


async def test_a_device_plugin_refuses_a_socket_directory_it_cannot_write(short_dir: Path) -> None:
    dp = short_dir / "dp"
    async with FakeKubelet(dp) as kubelet:
        with immutable(dp):
            status, lines = await finished("devplug_fake", "--device-plugin-dir", str(dp))
        assert kubelet.registrations == []
    assert status == 2
    assert lines == [
        f"devplug-fake: cannot create sockets in {dp}: it is not writable by this process "
        f"(uid {os.geteuid()})"
    ]


async def test_a_socket_directory_that_refuses_the_bind_stops_the_runner(short_dir: Path) -> None:
    """Writable when judged at start, not when the socket is made: the bind's own refusal."""
    dp, kubelet_dir = short_dir / "dp", short_dir / "k"
    dp.mkdir()
    settings = settings_for(short_dir, device_plugin_dir=dp, kubelet_socket=kubelet_dir / "kubelet.sock")
    runner = Runner(Widgets(), settings)
    refused: list[ConfigError] = []

    async def run() -> None:
        try:
            await runner.run(handle_signals=False)
        except ConfigError as exc:
            refused.append(exc)
        tg.cancel_scope.cancel()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await runner.wait_started()  # waiting for kubelet.sock
            with immutable(dp):
                async with FakeKubelet(kubelet_dir) as kubelet:
                    await anyio.sleep_forever()
    (error,) = refused
    assert str(error).startswith(f"cannot create the socket {dp}/example.com-widget-")
    assert str(error).endswith(
        f": operation not permitted (the directory must be writable by this process, uid {os.geteuid()})"
    )
    assert kubelet.registrations == []


def dra_args(root: Path, kubeconfig: Path) -> list[str]:
    (root / "k" / "plugins_registry").mkdir(parents=True, exist_ok=True)
    return [
        "devplug_fake", "--api", "dra", "--driver-name", DRIVER, "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--kubelet-root", str(root / "k"), "--cdi-dir", str(root / "cdi"),
    ]  # fmt: skip


async def test_a_second_copy_of_a_dra_driver_is_refused_before_it_publishes(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        args = dra_args(short_dir, api.write_kubeconfig(short_dir / "kc"))
        async with logged_process(args[0], args[1:], short_dir / "first.log"):
            (published,) = await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=30)
            dra_socket = short_dir / "k" / "plugins" / DRIVER / "dra.sock"
            await wait_until(dra_socket.exists, timeout=30)
            status, lines = await finished(*args)
            assert api.slices(node=NODE, driver=DRIVER) == [published]  # nothing written
    assert status == 2
    assert lines == [
        f"devplug-fake: another instance of DRA driver {DRIVER} is serving on {dra_socket}: stop it "
        "first (instances of a rolling update need their own --pod-uid)"
    ]


async def test_a_dra_driver_takes_over_the_sockets_of_a_killed_one(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        args = dra_args(short_dir, api.write_kubeconfig(short_dir / "kc"))
        dra_socket = short_dir / "k" / "plugins" / DRIVER / "dra.sock"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        process = await anyio.open_process([sys.executable, "-m", *args], cwd=ROOT, env=env)
        async with process:
            await wait_until(dra_socket.exists, timeout=30)
            process.send_signal(signal.SIGKILL)
            await process.wait()
        assert dra_socket.is_socket()  # left behind, dead
        log = short_dir / "second.log"
        async with logged_process(args[0], args[1:], log):
            await wait_until(
                lambda: '"serving"' in log.read_text(), timeout=30, what="the second one serving"
            )
        assert '"stale_socket_removed"' in log.read_text()


async def test_a_dra_driver_refuses_a_socket_directory_it_cannot_write(short_dir: Path) -> None:
    data_dir = short_dir / "k" / "plugins" / DRIVER
    (data_dir / "state").mkdir(parents=True)
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        args = dra_args(short_dir, api.write_kubeconfig(short_dir / "kc"))
        with immutable(data_dir):
            status, lines = await finished(*args)
        assert api.slices(node=NODE, driver=DRIVER) == []
    assert status == 2
    assert lines == [
        f"devplug-fake: cannot create sockets in {data_dir}: it is not writable by this process "
        f"(uid {os.geteuid()})"
    ]


class LateWidgets(Widgets):
    """Lists its devices once ``listed`` is set: the driver serves its sockets only then."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = anyio.Event()

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        await self.listed.wait()
        async for devices in super().watch_devices():
            yield devices


async def test_a_dra_driver_stops_when_its_registration_socket_is_refused(short_dir: Path) -> None:
    """plugins_registry writable when judged at start, not when the socket is made."""
    registry = short_dir / "k" / "plugins_registry"
    registry.mkdir(parents=True)
    plugin = LateWidgets()
    refused: list[ConfigError] = []
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        settings = Settings(
            api="dra",
            driver_name=DRIVER,
            node_name=NODE,
            kubeconfig=api.write_kubeconfig(short_dir / "kc"),
            kubelet_root=short_dir / "k",
            cdi_dir=short_dir / "cdi",
        )
        driver = DraDriver([plugin], settings)

        async def run() -> None:
            try:
                await driver.run(handle_signals=False)
            except ConfigError as exc:
                refused.append(exc)
            tg.cancel_scope.cancel()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await wait_until(lambda: driver.publisher is not None, what="the driver opened")
                with immutable(registry):
                    plugin.listed.set()
                    await anyio.sleep_forever()
    (error,) = refused
    assert str(error) == (
        f"cannot create the socket {registry}/{DRIVER}-reg.sock: operation not permitted "
        f"(the directory must be writable by this process, uid {os.geteuid()})"
    )
    assert not driver.dra_socket.exists()  # stopped, removed


async def test_a_dra_driver_whose_directory_cannot_be_made_says_why_in_words(short_dir: Path) -> None:
    (short_dir / "k").mkdir()
    (short_dir / "k" / "plugins").write_text("a file where a directory should be\n")
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        status, lines = await finished(*dra_args(short_dir, api.write_kubeconfig(short_dir / "kc")))
    assert status == 2
    assert lines == [
        f"devplug-fake: cannot create the directory {short_dir / 'k' / 'plugins' / DRIVER}: "
        "a part of the path is not a directory"
    ]
