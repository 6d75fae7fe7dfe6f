"""Plain counters behind metrics, readiness and debug dumps: no Prometheus, no I/O.

The servicer and the resource runner record into these on every call; they cost a clock read,
an addition and a bisect, so they are always on. ``devplug.metrics`` turns them into the
Prometheus exposition only when ``--metrics-address`` is set, at scrape time.

One :class:`ResourceCounters` lives per resource name for the whole process: a resource that is
restarted (a reload, a replaced plugin) keeps counting where it left off, as Prometheus expects
of a counter.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devplug._core.state import Snapshot

DURATION_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the RPC latency histogram: from a cached answer to a slow hook."""

UNARY_METHODS = ("GetDevicePluginOptions", "GetPreferredAllocation", "Allocate", "PreStartContainer")
METHODS = (*UNARY_METHODS, "ListAndWatch")

UNSPECIFIED = "unspecified"
"""The reason of a health transition the plugin gave no reason for."""


class RpcStats:
    """Requests, errors by status code and a latency histogram of one RPC method."""

    __slots__ = ("buckets", "errors", "requests", "seconds")

    def __init__(self) -> None:
        self.requests = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # the last one: +Inf
        self.errors: Counter[str] = Counter()

    def observe(self, seconds: float) -> None:
        """One call that took ``seconds`` (counted whether it failed or not)."""
        self.requests += 1
        self.seconds += seconds
        self.buckets[bisect_left(DURATION_BUCKETS, seconds)] += 1

    def failed(self, code: str) -> None:
        self.errors[code] += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count) pairs as the exposition wants them, ending with +Inf."""
        total = 0
        out = []
        for bound, count in zip((*map(str, DURATION_BUCKETS), "+Inf"), self.buckets, strict=True):
            total += count
            out.append((bound, float(total)))
        return out


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
