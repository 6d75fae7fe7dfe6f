"""Iterates a plugin's ``watch_devices`` for as long as it runs; shared by both Kubernetes APIs.

Every item is checked (a sequence of :class:`~devplug.Device`) and handed to ``publish``; an
exception restarts the generator after a capped back-off, with the last good set kept in force;
a generator that returns leaves its last set in force for good. A resource with no device in
force for :data:`NO_DEVICES_WARNING_AFTER` seconds is reported once (``no_devices_listed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from devplug._runtime.backoff import Backoff
from devplug._versioned import Versioned
from devplug.models import Device

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from devplug.plugin import DevicePlugin

NO_DEVICES_WARNING_AFTER = 30.0
"""Seconds without a device in force (no list yet, or empty lists) before ``no_devices_listed`` is
logged: long enough for a slow first scan, short enough to be seen in the first minute of a
plugin that looks in the wrong place."""


async def feed_devices(
    plugin: DevicePlugin,
    publish: Callable[[tuple[Device, ...]], Awaitable[int]],
    log: Any,
    *,
    warn_after: float = NO_DEVICES_WARNING_AFTER,
) -> None:
    """Run ``plugin.watch_devices()`` into ``publish`` until cancelled or the generator returns.

    ``publish`` takes a checked set and returns how many devices are in force afterwards (for
    the log line when the generator ends). While none is in force, ``no_devices_listed`` is logged at
    warning level once ``warn_after`` seconds have passed, then not again until devices came
    and went.
    """
    watch = _NoDevicesWatch(plugin.resource_name, log, warn_after)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        try:
            await _feed(plugin, publish, log, watch)
        finally:
            tg.cancel_scope.cancel()


async def _feed(
    plugin: DevicePlugin,
    publish: Callable[[tuple[Device, ...]], Awaitable[int]],
    log: Any,
    watch: _NoDevicesWatch,
) -> None:
    backoff = Backoff(initial=0.5, maximum=30.0)
    in_force = 0
    while True:
        try:
            async for devices in plugin.watch_devices():
                items = checked(devices, log)
                if items is not None:
                    in_force = await publish(items)
                    watch.update(in_force)
                backoff.reset()
        except Exception as exc:
            delay = backoff.next()
            log.exception("watch_devices_failed", error=str(exc), retry_in=round(delay, 3))
            await anyio.sleep(delay)
            continue
        log.warning("watch_devices_ended", keeping=in_force)
        return


class _NoDevicesWatch:
    """Logs ``no_devices_listed`` once per stretch of ``after`` seconds with nothing in force."""

    def __init__(self, resource: str, log: Any, after: float) -> None:
        self._resource = resource
        self._log = log
        self._after = after
        self._empty = Versioned(True)  # nothing is in force before the first list

    def update(self, in_force: int) -> None:
        empty = in_force == 0
        if empty != self._empty.value:
            self._empty.set(empty)

    async def run(self) -> None:
        while True:
            version = self._empty.version
            if not self._empty.value:
                await self._empty.newer_than(version)
                continue
            with anyio.move_on_after(self._after):
                await self._empty.newer_than(version)
                continue
            self._log.warning(
                "no_devices_listed",
                resource=self._resource,
                seconds=self._after,
                note="watch_devices has listed no device; is the plugin looking in the right place?",
            )
            await self._empty.newer_than(version)  # once: until devices come (and perhaps go again)


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
