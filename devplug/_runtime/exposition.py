"""The Prometheus exposition of a process (imported only when metrics are on).

Everything is read at scrape time: what the host counts (readiness, reloads, the declared event
counters) here, what each service counts through the collectors it contributes. The hot paths
record into plain counters only, and prometheus-client never runs there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from devplug.metrics import event_counters

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from prometheus_client.metrics_core import Metric


class Observed(Protocol):
    """What ``/healthz``, ``/readyz``, ``/debug/state`` and ``/metrics`` read from the process."""

    @property
    def reloads(self) -> Mapping[str, int]:
        """Configuration reloads by result: applied, failed."""

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether the process is ready, and if not every reason why."""

    def debug_state(self) -> dict[str, Any]:
        """The JSON document of ``/debug/state``."""


class HostCollector(Collector):
    """devplug_ready, devplug_reloads and every declared event counter."""

    def __init__(self, host: Observed) -> None:
        self._host = host

    def collect(self) -> Iterator[Metric]:
        ready, _ = self._host.readiness()
        yield GaugeMetricFamily("devplug_ready", "1 when /readyz answers ready.", value=float(ready))
        reloads = CounterMetricFamily(
            "devplug_reloads", "Configuration reloads (SIGHUP) by result.", labels=["result"]
        )
        for result in ("applied", "failed"):
            reloads.add_metric([result], self._host.reloads[result])
        yield reloads
        for counter in event_counters():
            family = CounterMetricFamily(counter.name, counter.documentation, labels=list(counter.labelnames))
            for labels, count in counter.samples():
                family.add_metric(list(labels), count)
            yield family


def registry_for(host: Observed, collectors: Sequence[Collector] = ()) -> CollectorRegistry:
    """A registry of the host's metrics, its services' ``collectors`` and the usual process ones."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(host))
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The exposition in the format ``accept`` asks for (OpenMetrics or text) and its type."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
