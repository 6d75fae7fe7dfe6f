"""The kubelet's DRA health cache (``healthinfo.go``): the latest report per device, by time of receipt.

Every NodeWatchResources message updates the devices it lists, stamped with the time it
arrived (not the driver's own time stamp). A device not reported again within its timeout
(``health_check_timeout_seconds`` when positive, else the kubelet's 30 s) reads ``Unknown``;
devices left out of a message keep their last state until then. The end of a driver's stream
drops everything known about that driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from devplug._text import cut_to_bytes

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from devplug.testing._kubelet.dra_resource import HealthName, HealthReport

DeviceKey = tuple[str, str]
"""``(pool, device)``."""


@dataclass(frozen=True)
class _Entry:
    health: HealthName
    received: float
    timeout: float | None  # None: the kubelet's default, read when asked
    message: str = ""


MESSAGE_BYTES = 1024
"""``ResourceHealthMessageMaxLength``: the kubelet cuts a longer message to 1021 bytes and ``...``."""


def kept_message(message: str) -> str:
    """``message`` as the kubelet keeps it (``truncateHealthMessage``: Go counts bytes)."""
    return cut_to_bytes(message, MESSAGE_BYTES, errors="replace")


class HealthCache:
    """Device health by driver, as the kubelet keeps it."""

    def __init__(self, default_timeout: Callable[[], float]) -> None:
        """``default_timeout`` gives the kubelet's timeout (30 s) at each use, so tests may shorten it."""
        self._default_timeout = default_timeout
        self._drivers: dict[str, dict[DeviceKey, _Entry]] = {}

    def update(self, driver: str, reports: Sequence[HealthReport], now: float) -> None:
        """Take one message of ``driver``'s stream, received at ``now`` (``time.monotonic()``)."""
        devices = self._drivers.setdefault(driver, {})
        for report in reports:
            timeout = float(report.timeout_seconds) if report.timeout_seconds > 0 else None
            devices[(report.pool, report.device)] = _Entry(
                report.health, now, timeout, kept_message(report.message)
            )

    def clear(self, driver: str) -> None:
        """Forget ``driver`` (its stream ended)."""
        self._drivers.pop(driver, None)

    def reset(self) -> None:
        self._drivers.clear()

    def view(self, driver: str, now: float) -> dict[DeviceKey, HealthName]:
        """Each known device of ``driver`` and its health at ``now``."""
        return {
            key: "Unknown" if now - entry.received > self._timeout(entry) else entry.health
            for key, entry in self._drivers.get(driver, {}).items()
        }

    def messages(self, driver: str, now: float) -> dict[DeviceKey, str]:
        """Each known device of ``driver`` and its health message at ``now`` (empty when its
        health reads ``Unknown``, as the kubelet clears it)."""
        return {
            key: "" if now - entry.received > self._timeout(entry) else entry.message
            for key, entry in self._drivers.get(driver, {}).items()
        }

    def next_expiry(self, driver: str, now: float) -> float | None:
        """Seconds until the next device of ``driver`` turns ``Unknown``; ``None`` if none will."""
        waits = [
            entry.received + self._timeout(entry) - now
            for entry in self._drivers.get(driver, {}).values()
            if now - entry.received <= self._timeout(entry) and entry.health != "Unknown"
        ]
        return max(0.0, min(waits)) if waits else None

    def _timeout(self, entry: _Entry) -> float:
        return entry.timeout if entry.timeout is not None else self._default_timeout()
