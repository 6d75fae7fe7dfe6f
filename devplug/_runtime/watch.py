"""Event-driven watching of the kubelet's directories (inotify through asyncinotify).

One watcher per process serves every resource. It bumps a generation counter on every event and
counts the creations of each file name; each waiter then re-reads the state it cares about (is
my socket still the file I made? has kubelet.sock been created since I registered?). Decisions
taken from state rather than from event order de-duplicate the two restart signals (own socket
deleted, kubelet.sock created) and make the initial state at start-up a non-event.

Creations are counted from events, not inferred from the file: a kubelet that restarts within
one timer tick can leave a new kubelet.sock with the old one's inode number and timestamps.

The kubelet's directories are the kubelet's: it creates them when it starts (the device manager
its ``device-plugins``, the plugin watcher ``plugins_registry``), and a plugin that created them
would turn a mistyped path into a directory nobody ever looks at. A directory that is missing,
or that disappears while watched, is waited for: its nearest existing ancestor is watched
instead, so that its creation is seen at once, and ``kubelet_directory_missing`` is logged (at
once, then with back-off) until it is there.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio
import structlog
from asyncinotify import Inotify, Mask

from devplug._text import os_error_text
from devplug._versioned import Versioned
from devplug.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus
    from asyncinotify import Watch

log = structlog.get_logger(__name__)
T = TypeVar("T")

# Every watch uses the same mask: adding a watch on a path already watched (a missing
# directory's ancestor that is itself a watched directory) replaces the mask of that watch.
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
_GONE = Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED
_ABSENT = (errno.ENOENT, errno.ENOTDIR)

MISSING_WARNING_BACKOFF = (10.0, 300.0)
"""Seconds between two ``kubelet_directory_missing`` warnings for one path: the first interval,
doubled after each warning up to the second."""

_MISSING_NOTE = "the kubelet creates this directory when it starts; waiting for it (is the path right?)"


class DirWatcher:
    """Watches a few directories: a generation counter for waiters, and creation counts.

    ``changed_after(g)`` waits for the generation to pass ``g``; :meth:`wait_for` re-checks a
    condition after every change (the appearance of a missing directory is a change).

    Args:
        paths: the directories; the first one is where a resource puts its sockets.
        on_found: called with a directory that was missing when it appears, before any waiter
            sees it; an exception it raises (a ConfigError) ends :meth:`run`.
    """

    def __init__(self, *paths: Path, on_found: Callable[[Path], None] | None = None) -> None:
        self.paths = tuple(dict.fromkeys(paths))
        self._changes = Versioned(None)
        self._created: Counter[Path] = Counter()
        self._lost = 0  # queue overflows and (re)appeared directories: anything may have appeared
        self._on_found = on_found
        self._watched: dict[Path, int] = {}  # a present directory -> its watch descriptor
        self._ancestors: dict[int, Watch] = {}  # watches on ancestors of missing directories
        self._missing_changed = Versioned(None)

    @property
    def path(self) -> Path:
        """The first directory watched."""
        return self.paths[0]

    @property
    def generation(self) -> int:
        """Moves on after every inotify event: a waiter reads it before it looks."""
        return self._changes.version

    @property
    def missing(self) -> tuple[Path, ...]:
        """The directories that are not there now (waited for), in the order given."""
        return tuple(p for p in self.paths if p not in self._watched)

    def creations(self, path: Path) -> int:
        """How many times a file appeared at ``path`` (in a watched directory) since watching began.

        After lost events (queue overflow, a directory that appeared or was re-created) every
        count moves on, so a waiter re-checks rather than missing a creation.
        """
        return self._created[path] + self._lost

    async def changed_after(self, generation: int) -> None:
        """Return once something in a watched directory changed after ``generation`` was read."""
        await self._changes.newer_than(generation)

    async def wait_for(self, check: Callable[[], T | None]) -> T:
        """Run ``check`` now and after every change until it returns something other than None."""
        return await self._changes.wait_for(lambda _: check())

    async def wait_present(self, directory: Path) -> None:
        """Return once ``directory`` (one of :attr:`paths`) is there and watched."""
        await self.wait_for(lambda: True if directory in self._watched else None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled; started once the watches are set, whether or not all exist.

        Raises:
            ConfigError: a directory cannot be watched (no permission, the inotify watch limit),
                or what ``on_found`` raised.
        """
        with Inotify() as inotify:
            self._resolve(inotify, initial=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._warn_missing)
                task_status.started()
                async for event in inotify:
                    watch = event.watch
                    wd = watch.wd if watch is not None else None
                    if event.mask & Mask.Q_OVERFLOW:
                        self._lost += 1
                    elif event.name is not None and event.mask & (Mask.CREATE | Mask.MOVED_TO):
                        for path, watched_wd in self._watched.items():
                            if watched_wd == wd:
                                self._created[path / event.name] += 1
                    if wd is not None and event.mask & _GONE:
                        self._lose(inotify, wd, watch)
                    if self.missing:
                        self._resolve(inotify)
                    self._changes.bump()

    def _lose(self, inotify: Inotify, wd: int, watch: Watch | None) -> None:
        """A watched directory (or an ancestor) was deleted or moved: it is waited for again."""
        gone = [p for p, w in self._watched.items() if w == wd]
        for path in gone:
            log.warning("watched_directory_gone", path=str(path), note="waiting for it to be there again")
            del self._watched[path]
        self._ancestors.pop(wd, None)
        if gone:
            self._lost += 1
            self._missing_changed.bump()
        if watch is not None:
            with contextlib.suppress(OSError):  # the kernel may have dropped it already
                inotify.rm_watch(watch)

    def _resolve(self, inotify: Inotify, *, initial: bool = False) -> None:
        """Watch every directory that is there; for each one missing, its nearest ancestor.

        Repeated until a pass neither finds a directory nor adds a watch: a directory may
        appear (or an ancestor vanish) between one add_watch and the next, and only a watch
        that was in place before the last look guarantees that the next change is seen.
        """
        while True:
            found, needed, added = self._look(inotify)
            if found and not initial:
                self._lost += 1  # files may have been made in it before the watch
                self._missing_changed.bump()
                for path in found:
                    log.info("kubelet_directory_found", path=str(path))
                    if self._on_found is not None:
                        self._on_found(path)
            if not found and not added:
                break
        present = set(self._watched.values())
        for wd, watch in list(self._ancestors.items()):
            if wd not in needed:
                del self._ancestors[wd]
                if wd not in present:  # a watched directory may be a missing one's ancestor
                    with contextlib.suppress(OSError):
                        inotify.rm_watch(watch)

    def _look(self, inotify: Inotify) -> tuple[list[Path], set[int], bool]:
        """One pass: the directories found, the ancestor watches needed, whether one is new."""
        found = []
        needed: set[int] = set()
        added = False
        for path in self.missing:
            try:
                self._watched[path] = inotify.add_watch(path, _MASK).wd
            except OSError as exc:
                if exc.errno not in _ABSENT:
                    raise ConfigError(os_error_text(exc, f"watch the directory {path}")) from None
                ancestor = _watch_ancestor(inotify, path)
                if ancestor is not None:
                    added = added or ancestor.wd not in self._ancestors
                    self._ancestors[ancestor.wd] = ancestor
                    needed.add(ancestor.wd)
            else:
                found.append(path)
        return found, needed, added

    async def _warn_missing(self) -> None:
        """Log each missing directory at once, then with back-off, until it is there."""
        due: dict[Path, tuple[float, float]] = {}  # path -> (when to warn next, interval)
        while True:
            seen = self._missing_changed.version
            now = anyio.current_time()
            missing = self.missing
            due = {p: due.get(p, (now, MISSING_WARNING_BACKOFF[0])) for p in missing}
            for path, (when, interval) in due.items():
                if when <= now:
                    log.warning(
                        "kubelet_directory_missing", path=str(path), note=_MISSING_NOTE, next_in=interval
                    )
                    due[path] = (now + interval, min(interval * 2, MISSING_WARNING_BACKOFF[1]))
            wake = min((when for when, _ in due.values()), default=math.inf)
            with anyio.move_on_after(wake - now):
                await self._missing_changed.newer_than(seen)


def _watch_ancestor(inotify: Inotify, path: Path) -> Watch | None:
    """Watch the nearest existing directory above ``path`` (None: not even ``/`` could be)."""
    current = Path(os.path.abspath(path))
    for parent in current.parents:
        try:
            return inotify.add_watch(parent, _MASK)
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise ConfigError(os_error_text(exc, f"watch {parent} (above {path})")) from None
    return None
