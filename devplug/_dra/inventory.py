"""The devices of every plugin a DRA driver serves, under their ResourceSlice names, versioned.

Each plugin's ``watch_devices`` feeds its part (see :mod:`devplug._runtime.feed`); the inventory
merges the parts into one list of entries, bumps its version when the list changes, and wakes
whoever waits for a newer version (the slice publisher, every health stream).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from devplug._dra.names import device_name, resource_prefix
from devplug._runtime.state import DeviceState
from devplug._versioned import Versioned

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
        # The snapshot's version is the box's: both move on together, in update only.
        self._snapshot = Versioned(Snapshot(0, (), {}, complete=not plugins))

    @property
    def current(self) -> Snapshot:
        return self._snapshot.value

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
        self._snapshot.set(Snapshot(self._snapshot.version + 1, tuple(entries), by_name, complete))
        return True

    def replace(self, index: int, plugin: DevicePlugin) -> None:
        """Serve plugin ``index``'s resource with ``plugin`` from now on (a reload); its devices
        stay listed, under the same names, until the new plugin lists its own.

        Raises:
            ValueError: ``plugin`` serves another resource.
        """
        old = self.plugins[index]
        if plugin.resource_name != old.resource_name:
            raise ValueError(f"plugin {index} serves {old.resource_name}, not {plugin.resource_name}")
        self.plugins = (*self.plugins[:index], plugin, *self.plugins[index + 1 :])
        snapshot = self.current
        entries = tuple(replace(e, plugin=plugin) if e.plugin is old else e for e in snapshot.entries)
        by_name = {e.name: e for e in entries}
        self._snapshot.set(Snapshot(self._snapshot.version + 1, entries, by_name, snapshot.complete))

    async def newer_than(self, version: int) -> Snapshot:
        """Wait for a version newer than ``version`` and return it."""
        return await self._snapshot.newer_than(version)


def _prefixes(plugins: Sequence[DevicePlugin]) -> list[str]:
    """Name prefixes keeping several resources' devices apart (none for a single plugin)."""
    if len(plugins) < 2:
        return [""] * len(plugins)
    prefixes: list[str] = []
    for plugin in plugins:
        prefix = resource_prefix(plugin.resource_name)
        prefixes.append(prefix if prefix not in prefixes else f"{prefix}{len(prefixes)}")
    return prefixes
