"""Event-driven watching of a kubelet directory (inotify through asyncinotify).

One watcher per directory serves every resource of the process. It bumps a generation counter
on every event and counts the creations of each file name; each waiter then re-reads the state
it cares about (is my socket still the file I made? has kubelet.sock been created since I
registered?). Decisions taken from state rather than from event order de-duplicate the two
restart signals (own socket deleted, kubelet.sock created) and make the initial state at
start-up a non-event.

Creations are counted from events, not inferred from the file: a kubelet that restarts within
one timer tick can leave a new kubelet.sock with the old one's inode number and timestamps.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
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
    """Watches a few directories: a generation counter for waiters, and creation counts.

    ``changed_after(g)`` waits for the generation to pass ``g``; :meth:`wait_for` re-checks a
    condition after every change.
    """

    def __init__(self, *paths: Path) -> None:
        self.paths = tuple(dict.fromkeys(paths))
        self.generation = 0
        self._event = anyio.Event()
        self._created: Counter[Path] = Counter()
        self._lost = 0  # queue overflows and re-created directories: anything may have appeared

    @property
    def path(self) -> Path:
        """The first directory watched (where a resource puts its sockets)."""
        return self.paths[0]

    def creations(self, path: Path) -> int:
        """How many times a file appeared at ``path`` (in a watched directory) since watching began.

        After lost events (queue overflow, directory re-created) every count moves on, so a
        waiter re-checks rather than missing a creation.
        """
        return self._created[path] + self._lost

    def _bump(self) -> None:
        self.generation += 1
        event, self._event = self._event, anyio.Event()
        event.set()

    async def changed_after(self, generation: int) -> None:
        """Return once something in a watched directory changed after ``generation`` was read."""
        while self.generation <= generation:
            await self._event.wait()

    async def wait_for(self, check: Callable[[], T | None]) -> T:
        """Run ``check`` now and after every change until it returns something other than None."""
        while True:
            generation = self.generation
            result = check()
            if result is not None:
                return result
            await self.changed_after(generation)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. Directories are created when missing (as the kubelet would)."""
        with Inotify() as inotify:

            def add(path: Path) -> None:
                os.makedirs(path, exist_ok=True)
                inotify.add_watch(path, _MASK)

            for path in self.paths:
                add(path)
            task_status.started()
            async for event in inotify:
                watch = event.watch
                if event.mask & Mask.Q_OVERFLOW:
                    self._lost += 1
                elif (
                    watch is not None
                    and event.name is not None
                    and event.mask & (Mask.CREATE | Mask.MOVED_TO)
                ):
                    self._created[watch.path / event.name] += 1
                if watch is not None and event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF):
                    log.warning("watched_directory_gone", path=str(watch.path))
                    with contextlib.suppress(OSError):  # the kernel may have dropped it already
                        inotify.rm_watch(watch)
                    add(watch.path)
                    self._lost += 1
                self._bump()
