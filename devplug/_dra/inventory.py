"""The devices of every plugin a DRA driver serves, under their ResourceSlice names, versioned.

Each plugin's ``watch_devices`` feeds its part (see :mod:`devplug._runtime.feed`); the inventory
merges the parts into one list of entries, bumps its version when the list changes, and wakes
whoever waits for a newer version (the slice publisher, every health stream).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from devplug._dra.names import device_name, resource_prefix
from devplug._runtime.state import DeviceState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from devplug.models import Device
    from devplug.plugin import DevicePlugin


@dataclass(frozen=True)
class Entry:
    """One device as the driver publishes it."""

    name: str
    """Its name in the ResourceSlice."""
    device: Device
    plugin: DevicePlugin

    @property
    def resource(self) -> str:
        return self.plugin.resource_name


@dataclass(frozen=True)
class Snapshot:
    version: int
    entries: tuple[Entry, ...]
    by_name: dict[str, Entry]
    complete: bool
    """Every plugin has listed its devices at least once."""


class Inventory:
    """The merged, versioned device list of a driver's plugins.

    Each plugin's part is a :class:`~devplug._runtime.state.DeviceState`, as in the device-plugin
    runtime (duplicate IDs refused, unchanged sets no new version); the merged snapshot is
    rebuilt when a part changes.
    """

    def __init__(self, plugins: Sequence[DevicePlugin]) -> None:
        self.plugins = tuple(plugins)
        self.parts = tuple(DeviceState() for _ in plugins)
        self._prefixes = _prefixes(self.plugins)
        self._snapshot = Snapshot(0, (), {}, complete=not plugins)
        self._changed = anyio.Event()

    @property
    def current(self) -> Snapshot:
        return self._snapshot

    def update(self, index: int, devices: Sequence[Device]) -> bool:
        """Make ``devices`` plugin ``index``'s part; False when nothing changed.

        Raises:
            ValueError: duplicate device IDs, or two devices under one DRA name (the set is
                refused, the last one kept).
        """
        ids = Counter(d.id for d in devices)
        if len(ids) != len(devices):
            raise ValueError(f"duplicate device IDs: {', '.join(sorted(i for i, n in ids.items() if n > 1))}")
        entries: list[Entry] = []
        for i, (plugin, prefix, part) in enumerate(
            zip(self.plugins, self._prefixes, self.parts, strict=True)
        ):
            listed = devices if i == index else part.current.devices
            entries.extend(Entry(d.name or device_name(d.id, prefix), d, plugin) for d in listed)
        by_name = {e.name: e for e in entries}
        if len(by_name) != len(entries):
            clash = sorted(n for n, c in Counter(e.name for e in entries).items() if c > 1)
            raise ValueError(f"several devices share the DRA device name {', '.join(clash)}")
        if not self.parts[index].publish(devices):
            return False
        complete = all(p.current.version > 0 for p in self.parts)
        self._snapshot = Snapshot(self._snapshot.version + 1, tuple(entries), by_name, complete)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        return True

    async def newer_than(self, version: int) -> Snapshot:
        """Wait for a version newer than ``version`` and return it."""
        while self._snapshot.version <= version:
            await self._changed.wait()
        return self._snapshot


def _prefixes(plugins: Sequence[DevicePlugin]) -> list[str]:
    """Name prefixes keeping several resources' devices apart (none for a single plugin)."""
    if len(plugins) < 2:
        return [""] * len(plugins)
    prefixes: list[str] = []
    for plugin in plugins:
        prefix = resource_prefix(plugin.resource_name)
        prefixes.append(prefix if prefix not in prefixes else f"{prefix}{len(prefixes)}")
    return prefixes
