"""Other servers of this resource in the same directory: a second copy of the plugin, or the
overlap of a rolling update.

The kubelet sends the resource's calls to the endpoint registered last and tells the one it
replaced nothing; that one's ListAndWatch stays open. When the newer one's stream ends, kubelets
up to 1.36 (one client per resource) disconnect the resource and turn its devices unhealthy,
although the older server still serves; kubelet 1.37, and the fake kubelet, which keep every
endpoint, hand the resource back to a remaining one. So a server that was replaced registers
again once every server that appeared after its registration is gone (:class:`Successors`):
needed up to 1.36, harmless from 1.37 (a moment without devices while it re-registers).

What a plugin can observe is the directory: a socket named as devplug names this resource's
sockets (``<vendor>-<name>-<8 hex>.sock``) that is not one of its own. A plugin that names its
sockets otherwise cannot be recognised, and the kubelet answers no question about who
registered a resource.
"""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING, Any

from devplug._runtime.sockets import is_live_socket, unique_socket_name

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from devplug._runtime.watch import DirWatcher


def _is_socket_itself(path: Path) -> bool:
    """A socket, not a link to one: a link is never followed (or connected to)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


class RivalWatch:
    """Logs ``another_plugin_socket`` once for each other server of the resource that appears."""

    def __init__(self, resource: str, directory: Path, log: Any) -> None:
        base = unique_socket_name(resource).rsplit("-", 1)[0]
        self._pattern = re.compile(re.escape(base) + r"-[0-9a-f]{8}\.sock")
        self._directory = directory
        self._log = log
        self.own: set[str] = set()
        """This resource's own socket names: added before each is created."""
        self._seen: set[str] | None = None

    def _names(self) -> set[str]:
        try:
            names = {p.name for p in self._directory.iterdir() if self._pattern.fullmatch(p.name)}
        except OSError:  # the directory is being re-created: the next change looks again
            return set()
        return {n for n in names - self.own if _is_socket_itself(self._directory / n)}

    def successors(self) -> Successors:
        """Follow the servers that appear from now on (called once registered)."""
        return Successors(self._names)

    def new(self) -> list[str] | None:
        """Sockets of another server that appeared since the last look (None when there are none)."""
        names = self._names()
        if self._seen is None:
            # The first look: a dead socket is a crashed predecessor's, not a rival.
            self._seen = names
            fresh = sorted(n for n in names if is_live_socket(self._directory / n))
        else:
            fresh = sorted(names - self._seen)
            self._seen |= names
        return fresh or None

    async def run(self, watcher: DirWatcher) -> None:
        """Look at every change of the directory until cancelled."""
        while True:
            for name in await watcher.wait_for(self.new):
                self._log.warning(
                    "another_plugin_socket",
                    other_socket=name,
                    note="another server of this resource: the kubelet keeps the last one registered",
                )


class Successors:
    """The other servers of the resource that appeared after this one registered: the kubelet
    took the resource over to them (it keeps the last one registered)."""

    def __init__(self, names: Callable[[], set[str]]) -> None:
        self._names = names
        self._before = names()
        self.seen: set[str] = set()
        """Every successor seen so far (by socket name)."""

    def all_gone(self) -> bool:
        """True once a successor has been seen and none is left: the last one stopped.

        Called on every change of the directory, so that a successor is seen while it serves.
        """
        present = self._names()
        self.seen |= present - self._before
        return bool(self.seen) and not self.seen & present
