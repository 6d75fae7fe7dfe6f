"""Event-driven watching of a kubelet directory (inotify through asyncinotify).

One watcher per directory serves every resource of the process. It does not interpret events:
it bumps a generation counter, and each waiter re-reads the state it cares about (is my socket
still mine? is kubelet.sock the same file?). Decisions taken from state rather than from event
order de-duplicate the two restart signals (own socket deleted, kubelet.sock created) and make
the initial state at start-up a non-event.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, TypeVar

import anyio
import structlog
from asyncinotify import Inotify, Mask

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from anyio.abc import TaskStatus

log = structlog.get_logger(__name__)
T = TypeVar("T")

_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_TO
    | Mask.MOVED_FROM
    | Mask.ATTRIB
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)


class DirWatcher:
    """Counts changes in one directory; ``changed_after(g)`` waits for the count to pass ``g``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.generation = 0
        self._event = anyio.Event()

    def _bump(self) -> None:
        self.generation += 1
        event, self._event = self._event, anyio.Event()
        event.set()

    async def changed_after(self, generation: int) -> None:
        """Return once something in the directory changed after ``generation`` was read."""
        while self.generation <= generation:
            await self._event.wait()

    async def wait_for(self, check: Callable[[], T | None]) -> T:
        """Run ``check`` now and after every change in the directory until it returns non-None."""
        while True:
            generation = self.generation
            result = check()
            if result is not None:
                return result
            await self.changed_after(generation)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. The directory is created if missing (as the kubelet would)."""
        started = False
        with Inotify() as inotify:
            while True:
                os.makedirs(self.path, exist_ok=True)
                watch = inotify.add_watch(self.path, _MASK)
                if not started:
                    task_status.started()
                    started = True
                else:
                    self._bump()  # state may have changed while the directory was gone
                async for event in inotify:
                    self._bump()
                    if event.watch is watch and event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF):
                        log.warning("watched_directory_gone", path=str(self.path))
                        with contextlib.suppress(OSError):  # the kernel may have dropped it
                            inotify.rm_watch(watch)
                        break
