"""The driver's lock: one prepare or unprepare at a time, within the process and, with rolling
updates, across the old and the new pod (an ``flock`` on a file under the driver's directory,
which both see; they then share state only through the checkpoint file).

Both are waited for on the event loop, never in a worker thread: a thread blocked in ``flock``
cannot be cancelled, so a wedged peer would hold the kubelet's call past its 45 s deadline. The
file lock is tried without blocking, then again after short sleeps, and the wait is given up at
a bound under the call's deadline (:func:`lock_wait`), so that the kubelet gets each claim's
error instead of a timed-out call.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

LOCK_WAIT = 35.0
"""Seconds a prepare or unprepare waits for the driver's lock at most, from the call's start:
under the kubelet's 45 s deadline for NodePrepareResources and NodeUnprepareResources, with
:data:`LOCK_MARGIN` left for the work itself and the answer."""
LOCK_MARGIN = 10.0
"""Seconds of a call's deadline kept for what follows the lock (hooks, spec and checkpoint
writes, the answer): a call with a deadline waits until this long before it, if that is sooner
than :data:`LOCK_WAIT`."""
_POLL_FIRST = 0.001
_POLL_MAX = 0.05
"""Seconds between tries of the file lock: doubling from the first to the last."""


class LockTimeout(Exception):
    """The driver's lock was not had in time; the message names it and the wait."""

    def __init__(self, message: str, lock: str, waited: float) -> None:
        super().__init__(message)
        self.lock = lock
        self.waited = waited


def lock_wait(time_left: float | None) -> float:
    """Seconds to wait for the lock in a call with ``time_left`` seconds before its deadline
    (None: no deadline): :data:`LOCK_MARGIN` before the deadline, at most :data:`LOCK_WAIT`,
    0 (one try) when the deadline is nearer than the margin."""
    if time_left is None:
        return LOCK_WAIT
    return max(0.0, min(LOCK_WAIT, time_left - LOCK_MARGIN))


class DriverLock:
    """The process lock and, when ``path`` is given, the file lock shared with other processes."""

    def __init__(self, path: Path | None, log: Any) -> None:
        self.path = path
        self._lock = anyio.Lock()
        self._log = log

    @contextlib.asynccontextmanager
    async def held(self, give_up: float) -> AsyncIterator[None]:
        """Hold both locks while the block runs.

        Args:
            give_up: the time (``anyio.current_time()``) after which waiting stops.

        Raises:
            LockTimeout: a lock was still taken at ``give_up``.
        """
        started = anyio.current_time()
        await self._process_lock(started, give_up)
        try:
            if self.path is None:
                yield
                return
            fd = await self._file_lock(self.path, started, give_up)
            try:
                yield
            finally:
                os.close(fd)
        finally:
            self._lock.release()

    async def _process_lock(self, started: float, give_up: float) -> None:
        try:
            self._lock.acquire_nowait()  # the common case: no wait, no checkpoint
            return
        except anyio.WouldBlock:
            pass
        with anyio.move_on_after(give_up - started) as scope:
            await self._lock.acquire()
        if scope.cancelled_caught:
            waited = anyio.current_time() - started
            raise LockTimeout(
                f"another prepare or unprepare of this driver is still running: gave up waiting for "
                f"the driver's lock after {waited:.1f} s, before the kubelet's call times out "
                "(the kubelet asks again)",
                lock="process",
                waited=waited,
            )

    async def _file_lock(self, path: Path, started: float, give_up: float) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if _try_flock(fd):
                return fd
            self._log.info("lock_wait", lock=str(path), note="another instance of the driver holds it")
            delay = _POLL_FIRST
            while True:
                left = give_up - anyio.current_time()
                if left <= 0:
                    waited = anyio.current_time() - started
                    raise LockTimeout(
                        f"the driver's lock {path} is held by another instance of the driver (the "
                        f"other pod of a rolling update?): gave up after {waited:.1f} s, before the "
                        "kubelet's call times out (the kubelet asks again)",
                        lock=str(path),
                        waited=waited,
                    )
                await anyio.sleep(min(delay, left))
                delay = min(delay * 2, _POLL_MAX)
                if _try_flock(fd):
                    return fd
        except BaseException:
            os.close(fd)
            raise


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def hold_exclusive(path: Path) -> int | None:
    """An open descriptor of ``path`` (created 0600) that holds its ``flock``, or None when
    another open file holds it (another process, or this one through another descriptor).

    The lock lasts until the descriptor is closed, by the holder or by its exit.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    if _try_flock(fd):
        return fd
    os.close(fd)
    return None
