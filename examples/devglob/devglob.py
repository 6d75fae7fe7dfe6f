"""devglob: a device plugin for host device nodes matching a glob (``/dev/ttyUSB*``, ``/dev/kvm``).

Every matching node is one device, named after the node: ``/dev/ttyUSB0`` is device ``ttyUSB0``.
A node that is not a character device (a stray regular file, a dangling symlink) is listed as
Unhealthy; a node that is removed leaves the list. Changes are seen through inotify on the
nodes' directory, as they happen.

Run it with its own options (``--help`` lists them all)::

    python examples/devglob/devglob.py --resource example.com/serial --pattern '/dev/ttyUSB*'

or, the same options, through the ``devplug`` command::

    PYTHONPATH=examples/devglob devplug run devglob:DevGlob --pattern '/dev/kvm' --resource example.com/kvm
"""

from __future__ import annotations

import fnmatch
import os
import stat
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from asyncinotify import Inotify, Mask
from pydantic import field_validator

import devplug
from devplug import ContainerAllocation, Device, DevicePlugin, DeviceSpec, Health, Settings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

__all__ = ["DevGlob", "DevGlobSettings", "main", "split_pattern"]

ENV_VAR = "DEVGLOB_DEVICES"
"""The variable a container gets: the host paths of its devices, comma-separated."""

# Nodes appearing and going (the kernel's devtmpfs creates and deletes them; tools rename them
# into place) and changing mode or owner (udev fixes both just after creation). IN_MODIFY is
# left out: every write to a tty would wake us.
_EVENTS = Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.ATTRIB | Mask.ONLYDIR
# The watched directory itself went away, and the watch with it.
_GONE = Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED


def split_pattern(pattern: str) -> tuple[PurePosixPath, str]:
    """Split ``/dev/dir/name-glob`` into the host directory and the glob of node names.

    Raises:
        ValueError: the pattern is not an absolute path below /dev, or has wildcards or ``..``
            outside its last component.
    """
    path = PurePosixPath(pattern)
    if not path.is_absolute() or not path.is_relative_to("/dev") or path == PurePosixPath("/dev"):
        raise ValueError("must be an absolute path below /dev, such as /dev/ttyUSB*")
    directory = path.parent
    if ".." in path.parts or any(c in str(directory) for c in "*?["):
        raise ValueError("wildcards may only appear in the last path component")
    return directory, path.name


class DevGlobSettings(Settings):
    """devglob: serves the host device nodes that match a glob (serial adapters, /dev/kvm)."""

    resource: str = "example.com/serial"
    """The extended resource name that pods request."""
    pattern: str = "/dev/ttyUSB*"
    """The device nodes as host paths below /dev; wildcards (*, ?, [...]) in the last part only."""
    dev_root: Path = Path("/dev")
    """Where this process sees the host's /dev (a container may mount it elsewhere)."""

    @field_validator("pattern")
    @classmethod
    def _valid_pattern(cls, value: str) -> str:
        split_pattern(value)
        return value


class DevGlob(DevicePlugin):
    """One device per host node matching ``pattern``; see the module docstring."""

    settings_class = DevGlobSettings  # what `devplug run devglob:DevGlob` parses

    def __init__(
        self,
        resource_name: str = "example.com/serial",
        pattern: str = "/dev/ttyUSB*",
        dev_root: Path | str = "/dev",
    ) -> None:
        self.resource_name = resource_name
        self.host_dir, self.glob = split_pattern(pattern)
        # Allocations name the host's paths; this process reads the same nodes under dev_root.
        self.local_dir = Path(dev_root, self.host_dir.relative_to("/dev"))

    @classmethod
    def from_settings(cls, settings: Settings) -> DevGlob:
        """The plugin that ``devplug run`` serves, built from :class:`DevGlobSettings`."""
        assert isinstance(settings, DevGlobSettings)
        return cls(settings.resource, settings.pattern, settings.dev_root)

    def scan(self) -> list[Device]:
        """The matching nodes now, sorted by name."""
        try:
            names = sorted(n for n in os.listdir(self.local_dir) if fnmatch.fnmatchcase(n, self.glob))
        except FileNotFoundError:
            return []
        return [Device(id=name, health=self.health(self.local_dir / name)) for name in names]

    @staticmethod
    def health(path: Path) -> Health:
        """Healthy when ``path`` is, or links to, a character device.

        Nodes are not opened to check them: opening a serial port can reset the board behind it.
        """
        try:
            mode = path.stat().st_mode
        except OSError:  # a dangling symlink, or the node went between listing and stat
            return Health.UNHEALTHY
        return Health.HEALTHY if stat.S_ISCHR(mode) else Health.UNHEALTHY

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        with Inotify() as inotify:
            # Watch first, then list, so that no change can fall between the two. If the
            # directory is missing this raises, and devplug calls us again after a back-off.
            inotify.add_watch(self.local_dir, _EVENTS)
            yield self.scan()
            async for event in inotify:
                if event.mask & _GONE:
                    yield []
                    raise FileNotFoundError(f"{self.local_dir} was removed")
                # No name: an event on the directory itself, or a queue overflow. Rescan then;
                # devplug drops a list equal to the last one, so rescanning is always safe.
                if event.name is None or fnmatch.fnmatchcase(event.name.name, self.glob):
                    yield self.scan()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        paths = [str(self.host_dir / d.id) for d in devices]
        return ContainerAllocation(
            envs={ENV_VAR: ",".join(paths)},
            devices=tuple(DeviceSpec.rw(p) for p in paths),
        )


def main(argv: list[str] | None = None) -> int:
    """Serve ``DevGlob`` with the standard runner options plus ``DevGlobSettings``' own."""

    return devplug.run(DevGlob.from_settings, settings_cls=DevGlobSettings, argv=argv, prog="devglob")


if __name__ == "__main__":
    sys.exit(main())
