"""Plain counters behind metrics, readiness and debug dumps: no Prometheus, no I/O.

The servicer and the resource runner record into these on every call; they cost a clock read,
an addition and a bisect, so they are always on. ``devplug.metrics`` turns them into the
Prometheus exposition only when ``--metrics-address`` is set, at scrape time.

One :class:`ResourceCounters` lives per resource name for the whole process: a resource that is
restarted (a reload, a replaced plugin) keeps counting where it left off, as Prometheus expects
of a counter.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devplug._runtime.telemetry import RpcStats

if TYPE_CHECKING:
    from devplug._runtime.state import Snapshot

UNARY_METHODS = ("GetDevicePluginOptions", "GetPreferredAllocation", "Allocate", "PreStartContainer")
METHODS = (*UNARY_METHODS, "ListAndWatch")

UNSPECIFIED = "unspecified"
"""The reason of a health transition the plugin gave no reason for."""


PENDING_REASONS: dict[tuple[str, str], str] = {}
"""Reasons plugins gave (devplug.metrics.note_health_reason) for the health change of a device in
the next list they yield, by (resource, device ID); consumed when that list is published."""


@dataclass
class ResourceCounters:
    """Everything counted for one resource name since the process started."""

    resource: str
    rpcs: dict[str, RpcStats] = field(default_factory=lambda: {m: RpcStats() for m in METHODS})
    registrations: list[tuple[float, str]] = field(default_factory=list)
    """(time.time(), reason) of every accepted registration (ResourceStatus.registrations)."""
    lists_sent: int = 0
    """ListAndWatch messages sent, on any server instance."""
    last_sent_at: float | None = None
    """time.monotonic() of the last ListAndWatch message sent, on any server instance."""
    last_sent: Snapshot | None = None
    """The snapshot that message carried: what the kubelet side last received."""
    transitions: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Health transitions by (new health, reason)."""

    def sent(self, snapshot: Snapshot, now: float) -> None:
        self.lists_sent += 1
        self.last_sent_at = now
        self.last_sent = snapshot

    def count_transitions(self, old: Snapshot, new: Snapshot) -> None:
        """Count the devices whose health differs between two consecutive snapshots."""
        notes = {d: r for (res, d), r in PENDING_REASONS.items() if res == self.resource}
        for device_id in notes:
            del PENDING_REASONS[(self.resource, device_id)]
        if old.version == 0:
            return  # the first list: nothing changed, it is only known now
        previous = old.by_id
        for device in new.devices:
            before = previous.get(device.id)
            if before is not None and before.health is not device.health:
                self.transitions[(device.health.value, notes.get(device.id, UNSPECIFIED))] += 1
