"""Prometheus metrics and probes (``--metrics-address HOST:PORT``; off unless set).

One HTTP port serves ``/metrics`` (the Prometheus exposition), ``/healthz`` (the event loop
answers), ``/readyz`` (every resource is registered and the kubelet side holds its device list;
503 with the reasons otherwise) and ``/debug/state`` (JSON: what each resource last sent to
the kubelet, and its registration history). prometheus-client (``pip install
'devplug[metrics]'``) is imported only when the address is set.

Backends and plugins reach the metrics through two functions that cost nothing when metrics
are off and need no prometheus-client:

* :func:`event_counter` declares a counter of their own (NVIDIA's XID events by code), exposed
  with the runtime's metrics;
* :func:`note_health_reason` says why a device's health changes in the next list a plugin
  yields, for the ``reason`` label of ``devplug_health_transitions_total``.

Metrics (labels in brackets)::

    devplug_rpc_requests_total           counter    [resource, method]
    devplug_rpc_errors_total             counter    [resource, method, code]
    devplug_rpc_duration_seconds         histogram  [resource, method]  (unary RPCs)
    devplug_registered                   gauge      [resource]          1 while registered
    devplug_registrations_total          counter    [resource, reason]
    devplug_devices                      gauge      [resource, health]
    devplug_device_list_age_seconds      gauge      [resource]          since the last list sent
    devplug_device_lists_sent_total      counter    [resource]
    devplug_list_and_watch_streams       gauge      [resource]
    devplug_health_transitions_total     counter    [resource, health, reason]
    devplug_ready                        gauge      []                  what /readyz answers
    devplug_reloads_total                counter    [result]            SIGHUP: applied / failed
    devplug_nvidia_xid_events_total      counter    [xid, verdict]      devplug-nvidia only
    devplug_devices_held                 gauge      [driver, api]       both APIs: held per API
    devplug_device_conflicts_total       counter    [driver, side]      both APIs: refused

plus prometheus-client's process_* and python_* metrics.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import TYPE_CHECKING

from devplug._device_plugin.telemetry import PENDING_REASONS
from devplug.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["MISSING_EXTRA", "EventCounter", "event_counter", "note_health_reason", "require_prometheus"]

MISSING_EXTRA = "--metrics-address needs prometheus-client: pip install 'devplug[metrics]'"

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*_total")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_COUNTERS: dict[str, EventCounter] = {}
_lock = threading.Lock()


class EventCounter:
    """A counter a backend increments (from any thread); exposed with devplug's metrics.

    Counts are kept whether or not metrics are served, so a scrape after a late start still
    sees every event since the process began.
    """

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._counts: Counter[tuple[str, ...]] = Counter()

    def inc(self, *labelvalues: object, amount: int = 1) -> None:
        """Count ``amount`` events with these label values (one per label name, in order).

        Raises:
            ValueError: the number of label values does not match the label names.
        """
        if len(labelvalues) != len(self.labelnames):
            raise ValueError(f"{self.name} takes {len(self.labelnames)} label values, got {len(labelvalues)}")
        key = tuple(str(v) for v in labelvalues)
        with _lock:
            self._counts[key] += amount

    def samples(self) -> list[tuple[tuple[str, ...], int]]:
        """(label values, count) of every label combination seen so far."""
        with _lock:
            return sorted(self._counts.items())


def event_counter(name: str, documentation: str, labelnames: Iterable[str] = ()) -> EventCounter:
    """The process's counter called ``name`` (created on first use; the same object after).

    ``name`` follows Prometheus conventions and ends in ``_total``
    (``devplug_nvidia_xid_events_total``).

    Raises:
        ValueError: an invalid name or label name, or ``name`` declared before with other labels.
    """
    labels = tuple(labelnames)
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid counter name {name!r} (letters, digits, _ and :, ending in _total)")
    bad = [label for label in labels if not _LABEL.fullmatch(label) or label.startswith("__")]
    if bad:
        raise ValueError(f"invalid label names for {name}: {', '.join(bad)}")
    with _lock:
        counter = _COUNTERS.get(name)
        if counter is None:
            counter = _COUNTERS[name] = EventCounter(name, documentation, labels)
    if counter.labelnames != labels:
        raise ValueError(f"{name} was declared with labels {counter.labelnames}, not {labels}")
    return counter


def event_counters() -> list[EventCounter]:
    """Every counter declared so far (what a scrape exposes)."""
    with _lock:
        return list(_COUNTERS.values())


def note_health_reason(resource: str, device_ids: Iterable[str], reason: str) -> None:
    """Say why ``device_ids`` of ``resource`` change health in the next list the plugin yields.

    ``reason`` becomes a label value: keep it a short fixed word (``xid``, ``ecc``,
    ``check_failed``, ``recovered``), never a free text. A device whose health does not change
    in that list forgets the note; a change without a note counts as ``unspecified``.
    """
    for device_id in device_ids:
        PENDING_REASONS[(resource, device_id)] = reason


def require_prometheus() -> None:
    """Check that prometheus-client can be imported.

    Raises:
        ConfigError: it cannot; the message says which extra to install.
    """
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
