"""Ctrl-C and SIGTERM in ``devplug demo``, ``conformance`` and ``inspect`` before they have
anything to show: one line and status 130, as ``run`` and ``kubelet`` do, and nothing left
running. (The demo's signals at later moments: tests/cli/demo.)"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from devplug.testing._process import signal_child
from tests.chaos.signal_kit import until_main
from tests.support import wait_until

pytestmark = pytest.mark.anyio
DEVPLUG = str(Path(sys.executable).parent / "devplug")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


async def interrupted(
    argv: list[str], signum: signal.Signals, *, when: Callable[[int], Awaitable[None]] | None = None
) -> tuple[int, str]:
    """Start ``devplug ARGV``, send ``signum`` once its main took the signals over (or, with
    ``when``, once that async callable returns), and return its status and stderr."""
    async with await anyio.open_process(
        [DEVPLUG, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as process:
        try:
            await until_main(process.pid, 30)
            if when is not None:
                await when(process.pid)
            signal_child(process, signum)
            await wait_until(lambda: process.returncode is not None, timeout=10, what="the command's exit")
        finally:
            if process.returncode is None:
                signal_child(process, signal.SIGKILL)
        assert process.stderr is not None
        err = b"".join([chunk async for chunk in process.stderr]).decode()
        assert process.returncode is not None
        return process.returncode, err


def plugins(pid: int) -> list[int]:
    """The children of ``pid`` that run the plugin command (not, say, the ``ldconfig -p`` that
    ctypes runs while modules load)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    found = []
    for kid in kids:
        try:
            argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if SLEEPER[-1].encode() in argv:
            found.append(int(kid))
    return found


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (its parent exited; init reaps it when it will)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command", ["demo", "conformance", "conformance-dra", "inspect"])
async def test_a_signal_while_it_starts_is_one_line_and_130(
    command: str, signum: signal.Signals, short_dir: Path
) -> None:
    """The signal lands while the command's modules load (main has just taken it over): a
    KeyboardInterrupt traceback, or a process killed by SIGTERM, before."""
    silent = await anyio.create_unix_listener(short_dir / "silent.sock")
    argv = {
        "demo": ["demo"],
        "conformance": ["conformance", "--timeout", "60", "--", *SLEEPER],
        "conformance-dra": ["conformance", "--dra", "--timeout", "60", "--", *SLEEPER],
        "inspect": ["inspect", str(short_dir / "silent.sock"), "--timeout", "60"],
    }[command]
    async with silent:
        status, err = await interrupted(argv, signum)
    assert (status, err) == (130, f"devplug {argv[0]}: interrupted\n")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("dra", [False, True], ids=["device-plugin", "dra"])
async def test_conformance_stopped_while_its_plugin_runs_stops_the_plugin(
    dra: bool, signum: signal.Signals
) -> None:
    """Status 130 and one line once the plugin it started is stopped (a SIGTERM used to kill
    conformance alone and leave the plugin running; a Ctrl-C exited 130 without a word)."""
    plugin: list[int] = []

    async def plugin_started(pid: int) -> None:
        plugin[:] = await wait_until(lambda: plugins(pid), timeout=30, what="the plugin process")

    argv = ["conformance", *(["--dra"] if dra else []), "--timeout", "60", "--", *SLEEPER]
    status, err = await interrupted(argv, signum, when=plugin_started)
    assert (status, err) == (130, "devplug conformance: interrupted\n")
    assert [pid for pid in plugin if not gone(pid)] == []


async def test_inspect_stopped_while_it_waits_for_an_answer(short_dir: Path) -> None:
    """A socket that accepts and never answers: Ctrl-C while inspect waits is status 130 and
    one line (only a ``--watch`` that follows its stream ends with 0)."""
    accepted = anyio.Event()

    async def hold(stream: anyio.abc.SocketStream) -> None:
        accepted.set()
        async with stream:
            await anyio.sleep_forever()

    async def waiting(pid: int) -> None:
        with anyio.fail_after(30):
            await accepted.wait()

    listener = await anyio.create_unix_listener(short_dir / "silent.sock")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        argv = ["inspect", str(short_dir / "silent.sock"), "--watch", "--timeout", "60"]
        status, err = await interrupted(argv, signal.SIGINT, when=waiting)
        tg.cancel_scope.cancel()
    assert (status, err) == (130, "devplug inspect: interrupted\n")
