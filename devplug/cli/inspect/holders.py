"""The HOLDER column of ``devplug inspect``: which pod holds each device, from the kubelet's
pod-resources API (the pods running on the node and the devices each container was given)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devplug._runtime.podresources import Holder, Holders

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
"""Where a kubelet with the default root serves its pod-resources API."""


def socket_to_read(given: str | None) -> Path | None:
    """The pod-resources socket to read: the one given, else the default one where it exists."""
    if given is not None:
        return Path(given)
    return DEFAULT_SOCKET if os.path.exists(DEFAULT_SOCKET) else None


def _text(holders: list[Holder]) -> str:
    shown = str(holders[0])
    return shown if len(holders) == 1 else f"{shown} and {len(holders) - 1} more"


async def plugin_holders(socket: Path | None, timeout: float) -> dict[str, str] | None:
    """Device ID → the pod holding it (any resource: a socket does not say which it serves);
    None when there is no socket to read, or it could not be read (said on stderr, once)."""
    holders = await _read(socket, timeout)
    if holders is None:
        return None
    return {device: _text(pods) for (_, device), pods in sorted(holders.plugin.items())}


async def dra_holders(socket: Path | None, timeout: float, driver: str | None) -> dict[str, str] | None:
    """``pool/device`` → the pod holding it through a claim of ``driver`` (any driver when
    None); None as :func:`plugin_holders`."""
    holders = await _read(socket, timeout)
    if holders is None:
        return None
    return {
        f"{pool}/{device}": _text(pods)
        for (name, pool, device), pods in sorted(holders.dra.items())
        if driver is None or name == driver
    }


_warned: set[str] = set()


async def _read(socket: Path | None, timeout: float) -> Holders | None:
    from devplug._runtime.podresources import PodResourcesError, read_holders

    if socket is None:
        return None
    try:
        return await read_holders(socket, call_timeout=timeout)
    except PodResourcesError as exc:
        if str(socket) not in _warned:
            _warned.add(str(socket))
            print(f"devplug inspect: {exc}; no HOLDER column", file=sys.stderr, flush=True)
        return None
