"""Iterates a plugin's ``watch_devices`` for as long as it runs; shared by both Kubernetes APIs.

Every item is checked (a sequence of :class:`~devplug.Device`) and handed to ``publish``; an
exception restarts the generator after a capped back-off, with the last good set kept in force;
a generator that returns leaves its last set in force for good.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from devplug._core.backoff import Backoff
from devplug.models import Device

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from devplug.plugin import DevicePlugin


async def feed_devices(
    plugin: DevicePlugin,
    publish: Callable[[tuple[Device, ...]], Awaitable[int]],
    log: Any,
) -> None:
    """Run ``plugin.watch_devices()`` into ``publish`` until cancelled or the generator returns.

    ``publish`` takes a checked set and returns how many devices are in force afterwards (for
    the log line when the generator ends).
    """
    backoff = Backoff(initial=0.5, maximum=30.0)
    in_force = 0
    while True:
        try:
            async for devices in plugin.watch_devices():
                items = checked(devices, log)
                if items is not None:
                    in_force = await publish(items)
                backoff.reset()
        except Exception as exc:
            delay = backoff.next()
            log.exception("watch_devices_failed", error=str(exc), retry_in=round(delay, 3))
            await anyio.sleep(delay)
            continue
        log.warning("watch_devices_ended", keeping=in_force)
        return


def checked(devices: object, log: Any) -> tuple[Device, ...] | None:
    """``devices`` as a tuple of Device, or None (logged) when it is not a sequence of them."""
    try:
        items: tuple[object, ...] = tuple(devices)  # type: ignore[arg-type]
        valid = tuple(d for d in items if isinstance(d, Device))
        if len(valid) != len(items):
            raise TypeError("watch_devices must yield sequences of devplug.Device")
    except (TypeError, ValueError) as exc:
        log.error("invalid_device_list", error=str(exc))
        return None
    return valid
