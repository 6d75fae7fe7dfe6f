"""One versioned device snapshot per resource, with a cursor per reader.

Every ListAndWatch stream keeps its own last-sent version and asks for anything newer, so a
stale stream can never consume the update meant for a fresh one (the classic "resources stuck
at 0 after a kubelet restart" bug), and a burst of changes reaches a slow reader as one message
holding the latest set.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devplug._versioned import Versioned

if TYPE_CHECKING:
    from collections.abc import Iterable

    from devplug.models import Device


@dataclass(frozen=True)
class Snapshot:
    """The complete device set of a resource at one version (version 0: nothing known yet)."""

    version: int
    devices: tuple[Device, ...]
    by_id: dict[str, Device] = field(compare=False, repr=False)


class DeviceState:
    """The current snapshot of one resource and a way to wait for a newer one."""

    def __init__(self) -> None:
        # The snapshot's version is the box's: both move on together, in publish only.
        self._snapshot = Versioned(Snapshot(0, (), {}))

    @property
    def current(self) -> Snapshot:
        return self._snapshot.value

    def publish(self, devices: Iterable[Device]) -> bool:
        """Make ``devices`` the current set. Returns False (no new version) if nothing changed.

        Raises ValueError on duplicate device IDs: the kubelet would silently keep one of them.
        """
        devices = tuple(devices)
        by_id = {d.id: d for d in devices}
        if len(by_id) != len(devices):
            counts = Counter(d.id for d in devices)
            dupes = sorted(i for i, n in counts.items() if n > 1)
            raise ValueError(f"duplicate device IDs: {', '.join(dupes)}")
        old = self._snapshot.value
        if old.version > 0 and old.devices == devices:
            return False
        self._snapshot.set(Snapshot(old.version + 1, devices, by_id))
        return True

    async def newer_than(self, version: int) -> Snapshot:
        """Wait until the current version is newer than ``version`` and return that snapshot."""
        return await self._snapshot.newer_than(version)
