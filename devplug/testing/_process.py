"""The plugin under test as a child process: started, watched, stopped, and its output kept."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import TYPE_CHECKING, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from pathlib import Path

    from anyio.abc import Process

T = TypeVar("T")


def signal_child(process: Process, signum: int) -> None:
    """Send ``signum`` to an anyio child process, unless it is known to have ended.

    Not ``process.send_signal``: on asyncio that is ``subprocess.Popen.send_signal``, which first
    polls the child, and when the child has just exited (a signal sent a moment before ended it)
    that poll reaps it ahead of asyncio's child watcher, which then reports status 255 ("Unknown
    child process") instead of the real one. A child that exited stays a zombie until the watcher
    reaps it, so its PID is still its own while ``returncode`` is None.
    """
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


class PluginExited(Exception):
    """The plugin process ended while something was waiting on it; the message says how."""


class PluginProcess:
    """One plugin command, run in a session of its own with stdout and stderr in a log file."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        """Where the command runs (default: this process's current directory)."""
        self.exited = anyio.Event()
        self.returncode: int | None = None
        self._process: Process | None = None
        self._waiting: set[anyio.CancelScope] = set()

    @property
    def pid(self) -> int | None:
        """The process ID once started."""
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the command; run :meth:`watch` next to what waits on it.

        Raises:
            OSError: the command could not be started.
        """
        with self.log_path.open("wb") as log:
            self._process = await anyio.open_process(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def watch(self) -> None:
        """Wait for the process to exit, then end every :meth:`guard` in progress."""
        process = self._process
        assert process is not None, "start() first"
        self.returncode = await process.wait()
        self.exited.set()
        for scope in self._waiting:
            scope.cancel()

    async def guard(self, call: Callable[[], Awaitable[T]], *, within: float | None = None) -> T:
        """Await ``call()`` unless the process exits first.

        Raises:
            PluginExited: the process had exited, or exited meanwhile.
            TimeoutError: ``within`` seconds passed first.
        """
        if self.exited.is_set():
            raise PluginExited(self.exit_reason())
        with anyio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                with anyio.fail_after(within):
                    return await call()
            finally:
                self._waiting.discard(scope)
        raise PluginExited(self.exit_reason())

    async def terminate(self, grace: float) -> bool:
        """Send SIGTERM and wait up to ``grace`` seconds; whether it exited.

        Waits on the process itself, not on :meth:`watch`: a clean-up may run after the task
        that watched it was cancelled.
        """
        if self._process is not None and not self.exited.is_set():
            signal_child(self._process, signal.SIGTERM)
            with anyio.move_on_after(grace):
                await self.watch()
        return self.exited.is_set()

    async def reap(self) -> None:
        """Kill whatever is left of the process and its session, and wait for it."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            _killpg(process.pid)
            await process.wait()
        _killpg(process.pid)  # children it left behind

    def status(self) -> str:
        """How it ended, in words ("exited with status 0", "was killed by SIGTERM")."""
        code = self.returncode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(-code).name}"
        return f"exited with status {code}"

    def exit_reason(self) -> str:
        """How it ended and the last thing it said."""
        # The last line that says something (a traceback's last line is often a box edge).
        said = [
            line.strip(" |") for line in self.output_tail().splitlines() if any(c.isalnum() for c in line)
        ]
        return f"the plugin {self.status()}" + (f" ({said[-1][:200]})" if said else "")

    def output_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines the plugin wrote to stdout or stderr."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 8192))
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
