"""What the process looks like from outside: readiness, the debug dump, metrics (pure reads).

:class:`Observed` is what the probes and the metrics read from the process; the runner
provides it, and they depend on this description, not on the runner.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug._core.resource import ResourceRunner, ResourceStatus
    from devplug._core.telemetry import ResourceCounters
    from devplug.models import Device


class Observed(Protocol):
    """What ``/healthz``, ``/readyz``, ``/debug/state`` and ``/metrics`` read (a ``Runner``)."""

    @property
    def counters(self) -> Mapping[str, ResourceCounters]:
        """What each resource name has counted since the process started."""

    @property
    def reloads(self) -> Mapping[str, int]:
        """Configuration reloads by result: applied, failed."""

    @property
    def resources(self) -> Mapping[str, ResourceStatus]:
        """The status of every resource served now."""

    def devices(self, resource: str) -> Sequence[Device]:
        """The devices ``resource`` lists now."""

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether the process is ready, and if not every reason why."""

    def debug_state(self) -> dict[str, Any]:
        """The JSON document of ``/debug/state``."""


def not_ready_reason(runner: ResourceRunner) -> str | None:
    """Why one resource is not ready (None: it is)."""
    status = runner.status
    if runner.state.current.version == 0:
        return "waiting for the plugin's first device list"
    if not status.registered:
        return f"not registered ({status.last_error})" if status.last_error else "not registered"
    if status.stats.lists_sent == 0:
        return "registered, but the kubelet has not received the device list yet"
    if status.stats.streams == 0:
        return "no ListAndWatch stream open (the kubelet stopped watching)"
    return None


def resource_state(runner: ResourceRunner) -> dict[str, Any]:
    """One resource in :meth:`Observed.debug_state`."""
    status, counters = runner.status, runner.counters
    last = counters.last_sent
    last_sent = None
    if last is not None and counters.last_sent_at is not None:
        last_sent = {
            "version": last.version,
            "seconds_ago": round(time.monotonic() - counters.last_sent_at, 3),
            "devices": [d.model_dump(mode="json") for d in last.devices],
        }
    watcher = status.stats.watcher_status
    return {
        "registered": status.registered,
        "socket": status.socket,
        "last_error": status.last_error,
        "current_version": runner.state.current.version,
        "streams": status.stats.streams,
        "lists_sent": counters.lists_sent,
        "last_sent": last_sent,
        "watcher_status": None if watcher is None else {"registered": watcher[0], "error": watcher[1]},
        "registrations": [
            {
                "at": datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(
                    timespec="milliseconds"
                ),
                "reason": reason,
            }
            for at, reason in status.registrations
        ],
    }
