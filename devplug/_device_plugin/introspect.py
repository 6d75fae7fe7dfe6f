"""One resource as the probes and ``/debug/state`` show it (pure reads)."""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug._device_plugin.resource import ResourceRunner


def not_ready_reason(runner: ResourceRunner) -> str | None:
    """Why one resource is not ready (None: it is)."""
    status = runner.status
    if runner.state.current.version == 0:
        return "waiting for the plugin's first device list"
    if runner.ledger is not None and not runner.ledger.ready:
        return "waiting for the device holders of both APIs"
    if not status.registered:
        return f"not registered ({status.last_error})" if status.last_error else "not registered"
    if status.stats.lists_sent == 0:
        return "registered, but the kubelet has not received the device list yet"
    if status.stats.streams == 0:
        return "no ListAndWatch stream open (the kubelet stopped watching)"
    return None


def resource_state(runner: ResourceRunner) -> dict[str, Any]:
    """One resource in ``/debug/state``."""
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
