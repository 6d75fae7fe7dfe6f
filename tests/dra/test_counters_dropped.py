"""An API server that drops shared counters (DRAPartitionableDevices off): the driver notices,
says so once, and publishes only the devices that consume no counters, without counter sets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from devplug import Device
from devplug.dra import CounterConsumption, CounterSet, DraDriver
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving, notify
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"
CARD = CounterSet(name="card-0", counters={"cores": "8", "slice0": "1", "slice1": "1"})


def half(i: int) -> Device:
    """One half of card 0: 4 cores and memory slice ``i``."""
    return Device(
        id=f"half-{i}",
        consumes_counters=(
            CounterConsumption(counter_set="card-0", counters={"cores": "4", f"slice{i}": "1"}),
        ),
        shared_counters=(CARD,),
    )


WHOLE = Device(
    id="whole",
    consumes_counters=(CounterConsumption(counter_set="card-0", counters=CARD.counters),),
    shared_counters=(CARD,),
)
# Declares the set but consumes nothing from it: nothing to overlap, so it is still offered.
DECLARER = Device(id="declarer", shared_counters=(CARD,))
PLAIN = Device(id="plain")


def pool(api: FakeKubeAPI) -> list[dict[str, Any]]:
    return [s["spec"] for s in api.slices(node=NODE, driver=DRIVER)]


def published(api: FakeKubeAPI) -> list[str]:
    return sorted(d["name"] for spec in pool(api) for d in spec.get("devices") or ())


def settled(api: FakeKubeAPI, driver: DraDriver, names: list[str]) -> bool:
    """The driver is in sync and the pool is whole: one generation, every slice counted, ``names``."""
    specs = pool(api)
    return (
        driver.debug_state()["slices"]["in_sync"]
        and published(api) == names
        and len({s["pool"]["generation"] for s in specs}) == 1
        and all(s["pool"]["resourceSliceCount"] == len(specs) for s in specs)
    )


def dropped_warnings(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "shared_counters_dropped"]


def no_counters(api: FakeKubeAPI) -> bool:
    specs = pool(api)
    return not any(
        "sharedCounters" in s or any("consumesCounters" in d for d in s.get("devices") or ()) for s in specs
    )


async def test_without_partitionable_devices_only_devices_consuming_nothing_are_published(
    short_dir: Path,
) -> None:
    plugin = Widgets(devices=[WHOLE, half(0), half(1), DECLARER, PLAIN])
    async with FakeKubeAPI(partitionable_devices=False) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([plugin], api, short_dir) as driver:
                await wait_until(lambda: settled(api, driver, ["declarer", "plain"]))
                assert no_counters(api)
                # The counter sets' slice is gone: one slice of the two devices is the pool.
                assert len(pool(api)) == 1
                assert driver.debug_state()["slices"]["counters_supported"] is False
                # Ready: the slices it can publish are published.
                await notify(driver.registration_socket)
                assert driver.readiness() == (True, [])

                # Re-published after a change of devices: still no partitions, no counters.
                plugin.set_devices([WHOLE, half(0), half(1), DECLARER, PLAIN, Device(id="extra")])
                await wait_until(lambda: settled(api, driver, ["declarer", "extra", "plain"]))
                assert no_counters(api)

                # ... and after the kubelet's wipe of the node's slices.
                assert api.wipe_slices(NODE, DRIVER) == 1
                await wait_until(lambda: published(api) == [])
                await wait_until(lambda: settled(api, driver, ["declarer", "extra", "plain"]))
                assert no_counters(api)
    (warning,) = dropped_warnings(logs)
    assert warning["log_level"] == "warning"
    assert "DRAPartitionableDevices" in warning["note"]
    assert "left out" in warning["note"]
    # The partitions were left out by design, not refused as broken.
    assert not [e for e in logs if e["event"] in ("device_not_published", "counter_set_conflict")]


async def test_a_pool_of_partitions_only_is_published_empty(short_dir: Path) -> None:
    plugin = Widgets(devices=[WHOLE, half(0), half(1)])
    async with FakeKubeAPI(partitionable_devices=False) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([plugin], api, short_dir) as driver:
                await wait_until(lambda: settled(api, driver, []))
                assert no_counters(api)
                assert len(pool(api)) == 1  # a pool always has a slice, here an empty one
    assert len(dropped_warnings(logs)) == 1


async def test_with_the_default_server_counters_are_published_and_nothing_said(short_dir: Path) -> None:
    plugin = Widgets(devices=[WHOLE, half(0), half(1), DECLARER, PLAIN])
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([plugin], api, short_dir) as driver:
                names = ["declarer", "half-0", "half-1", "plain", "whole"]
                await wait_until(lambda: settled(api, driver, names))
                assert driver.debug_state()["slices"]["counters_supported"] is True
                (counters,) = [s for s in pool(api) if "sharedCounters" in s]
                assert [c["name"] for c in counters["sharedCounters"]] == ["card-0"]
                assert sum("consumesCounters" in d for s in pool(api) for d in s.get("devices") or ()) == 3
    assert dropped_warnings(logs) == []


async def test_without_partitionable_devices_a_driver_without_counters_says_nothing(short_dir: Path) -> None:
    async with FakeKubeAPI(partitionable_devices=False) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([Widgets()], api, short_dir) as driver:
                await wait_until(lambda: settled(api, driver, ["w0", "w1", "w2", "w3"]))
                assert driver.debug_state()["slices"]["counters_supported"] is True
    assert dropped_warnings(logs) == []
