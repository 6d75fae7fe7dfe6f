"""The device-plugin service's Prometheus metrics (imported only when metrics are on).

Everything is read at scrape time from the runner's plain counters and status: the hot path
records into ``telemetry`` only, and prometheus-client never runs there.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from devplug._device_plugin.telemetry import UNARY_METHODS
from devplug.models import Health

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from prometheus_client.metrics_core import Metric

    from devplug._device_plugin.resource import ResourceStatus
    from devplug._device_plugin.telemetry import ResourceCounters
    from devplug.models import Device


class Resources(Protocol):
    """What the collector reads: the device-plugin service's resources (a ``Runner``)."""

    @property
    def counters(self) -> Mapping[str, ResourceCounters]:
        """What each resource name has counted since the process started."""

    @property
    def resources(self) -> Mapping[str, ResourceStatus]:
        """The status of every resource served now."""

    def devices(self, resource: str) -> Sequence[Device]:
        """The devices ``resource`` lists now."""


class DevicePluginCollector(Collector):
    """The device-plugin service's devplug_* metrics: RPCs, registrations, devices, streams."""

    def __init__(self, runner: Resources) -> None:
        self._runner = runner

    def collect(self) -> Iterator[Metric]:
        yield from self._rpcs()
        yield from self._resources()

    def _rpcs(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "devplug_rpc_requests",
            "DevicePlugin RPCs received (ListAndWatch: streams opened).",
            labels=["resource", "method"],
        )
        errors = CounterMetricFamily(
            "devplug_rpc_errors",
            "DevicePlugin RPCs that ended with an error, by gRPC status code.",
            labels=["resource", "method", "code"],
        )
        durations = HistogramMetricFamily(
            "devplug_rpc_duration_seconds",
            "Time devplug spent answering a unary DevicePlugin RPC (plugin hooks included).",
            labels=["resource", "method"],
        )
        for resource, counters in sorted(self._runner.counters.items()):
            for method, stats in counters.rpcs.items():
                requests.add_metric([resource, method], stats.requests)
                for code, count in sorted(stats.errors.items()):
                    errors.add_metric([resource, method, code], count)
                if method in UNARY_METHODS:
                    durations.add_metric([resource, method], stats.cumulative(), stats.seconds)
        yield requests
        yield errors
        yield durations

    def _resources(self) -> Iterator[Metric]:
        runner = self._runner
        registered = GaugeMetricFamily(
            "devplug_registered", "1 while the resource is registered with the kubelet.", labels=["resource"]
        )
        registrations = CounterMetricFamily(
            "devplug_registrations",
            "Accepted registrations by reason (start, replaced, kubelet_restarted, socket_deleted, "
            "rival_stopped, watcher).",
            labels=["resource", "reason"],
        )
        devices = GaugeMetricFamily(
            "devplug_devices", "Devices the plugin lists now, by health.", labels=["resource", "health"]
        )
        age = GaugeMetricFamily(
            "devplug_device_list_age_seconds",
            "Seconds since a ListAndWatch message (the device list) was last sent to the kubelet side.",
            labels=["resource"],
        )
        sent = CounterMetricFamily(
            "devplug_device_lists_sent", "ListAndWatch messages sent.", labels=["resource"]
        )
        streams = GaugeMetricFamily(
            "devplug_list_and_watch_streams", "ListAndWatch streams open now.", labels=["resource"]
        )
        transitions = CounterMetricFamily(
            "devplug_health_transitions",
            "Devices whose health changed from one device list to the next, by new health and reason.",
            labels=["resource", "health", "reason"],
        )
        now = time.monotonic()
        running = runner.resources
        for resource, counters in sorted(runner.counters.items()):
            reasons = Counter(reason for _, reason in counters.registrations)
            for reason, count in sorted(reasons.items()):
                registrations.add_metric([resource, reason], count)
            sent.add_metric([resource], counters.lists_sent)
            for (health, reason), count in sorted(counters.transitions.items()):
                transitions.add_metric([resource, health, reason], count)
            status = running.get(resource)
            if status is None:
                continue  # removed: its counters stay, its gauges go
            registered.add_metric([resource], float(status.registered))
            streams.add_metric([resource], status.stats.streams)
            if counters.last_sent_at is not None:
                age.add_metric([resource], now - counters.last_sent_at)
            by_health = Counter(d.health.value for d in runner.devices(resource))
            for health in Health:
                devices.add_metric([resource, health.value], by_health[health.value])
        yield from (registered, registrations, devices, age, sent, streams, transitions)
