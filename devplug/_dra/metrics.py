"""The DRA driver's Prometheus metrics (imported only when ``--metrics-address`` is set).

Read at scrape time from the driver's plain counters, like the device-plugin metrics.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from devplug._dra.servicer import METHODS
from devplug.models import Health

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from devplug._dra.inventory import Inventory
    from devplug._dra.publisher import SlicePublisher
    from devplug._dra.servicer import DraStats
    from devplug._runtime.ledger import Ledger


class Driver(Protocol):
    """What the metrics read from a driver."""

    driver: str
    stats: DraStats
    inventory: Inventory
    publisher: SlicePublisher | None
    registered: bool
    ledger: Ledger | None


class DraCollector(Collector):
    """devplug_dra_* metrics of one driver."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def collect(self) -> Iterator[Metric]:
        driver, stats = self._driver, self._driver.stats
        labels = ["driver", "method"]
        requests = CounterMetricFamily("devplug_dra_requests", "DRAPlugin calls received.", labels=labels)
        claims = CounterMetricFamily("devplug_dra_claims", "Claims in the calls received.", labels=labels)
        errors = CounterMetricFamily(
            "devplug_dra_claim_errors", "Claims answered with an error.", labels=labels
        )
        durations = HistogramMetricFamily(
            "devplug_dra_request_duration_seconds", "Time to answer a DRAPlugin call.", labels=labels
        )
        for method in METHODS:
            rpc = stats.rpcs[method]
            requests.add_metric([driver.driver, method], rpc.requests)
            claims.add_metric([driver.driver, method], stats.claims[method])
            errors.add_metric([driver.driver, method], stats.claim_errors[method])
            durations.add_metric([driver.driver, method], rpc.cumulative(), rpc.seconds)
        yield from (requests, claims, errors, durations)
        registered = GaugeMetricFamily(
            "devplug_dra_registration",
            "1 while the kubelet has accepted the registration.",
            labels=["driver"],
        )
        registered.add_metric([driver.driver], float(driver.registered))
        yield registered
        yield from self._slices()
        health = Counter(e.device.health.value for e in driver.inventory.current.entries)
        devices = GaugeMetricFamily(
            "devplug_dra_devices", "Devices published, by health.", labels=["driver", "health"]
        )
        for value in Health:
            devices.add_metric([driver.driver, value.value], health[value.value])
        yield devices
        streams = GaugeMetricFamily("devplug_dra_health_streams", "Open health streams.", labels=["driver"])
        streams.add_metric([driver.driver], stats.health_streams)
        yield streams
        yield from self._holders()

    def _holders(self) -> Iterator[Metric]:
        ledger, name = self._driver.ledger, self._driver.driver
        if ledger is None:
            return
        held = GaugeMetricFamily(
            "devplug_devices_held",
            "Devices held now by a pod or claim, by the API that gave them (both APIs served, or "
            "a node moving to DRA).",
            labels=["driver", "api"],
        )
        for api, count in ledger.counts().items():
            held.add_metric([name, api], count)
        conflicts = CounterMetricFamily(
            "devplug_device_conflicts",
            "Requests refused because the other API holds the device: allocate (device-plugin "
            "side), prepare (DRA side).",
            labels=["driver", "side"],
        )
        for side in ("allocate", "prepare"):
            conflicts.add_metric([name, side], ledger.conflicts[side])
        yield from (held, conflicts)

    def _slices(self) -> Iterator[Metric]:
        driver, publisher = self._driver, self._driver.publisher
        if publisher is None:
            return
        name = driver.driver
        slices = GaugeMetricFamily(
            "devplug_dra_resourceslices",
            "ResourceSlices of the node's pool at the last sync.",
            labels=["driver"],
        )
        slices.add_metric([name], publisher.slices if publisher.in_sync else 0)
        age = GaugeMetricFamily(
            "devplug_dra_resourceslices_synced_seconds",
            "Seconds since the slices were last found equal to the devices (absent while out of sync).",
            labels=["driver"],
        )
        if publisher.in_sync and publisher.synced_at is not None:
            age.add_metric([name], time.monotonic() - publisher.synced_at)
        writes = CounterMetricFamily(
            "devplug_dra_resourceslice_writes", "ResourceSlice writes by verb.", labels=["driver", "verb"]
        )
        for verb in ("create", "update", "delete"):
            writes.add_metric([name, verb], publisher.writes[verb])
        api_errors = CounterMetricFamily(
            "devplug_dra_api_errors",
            "Failed API server requests by HTTP status (unreachable: no answer).",
            labels=["driver", "status"],
        )
        for status, count in sorted(publisher.errors.items()):
            api_errors.add_metric([name, status], count)
        yield from (slices, age, writes, api_errors)
