"""Shared counters (partitionable devices): the models' rules, where the slices put them, and
publication through FakeKubeAPI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from devplug import Device
from devplug._dra.slices import CounterSlice, Pool, chunks, counter_set_entry
from devplug.dra import CounterConsumption, CounterSet
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"
# Names the API server accepts (DNS labels); FakeKubeAPI also wants C identifiers for counters.
CARD = CounterSet(name="card-0", counters={"cores": "8", "memory": "16Gi", "slice0": "1", "slice1": "1"})


def half(i: int) -> Device:
    """One half of card 0: 4 cores, 8Gi and memory slice ``i``."""
    return Device(
        id=f"half-{i}",
        consumes_counters=(
            CounterConsumption(
                counter_set="card-0", counters={"cores": "4", "memory": "8Gi", f"slice{i}": "1"}
            ),
        ),
        shared_counters=(CARD,),
    )


def test_counter_values_are_quantities_and_names_dns_labels() -> None:
    assert CounterSet(name="s", counters={"cores": 8, "slice0": "1"}).counters == {  # type: ignore[dict-item]
        "cores": "8",
        "slice0": "1",
    }
    assert CounterSet(name="gpu-0-counter-set", counters={"memory-slice-0": "1"}).name == "gpu-0-counter-set"
    bads: list[dict[str, Any]] = [
        {"Cores": "1"},
        {"under_score": "1"},
        {"x": "lots"},
        {},
        {f"c{i}": "1" for i in range(33)},
    ]
    for bad in bads:
        with pytest.raises(ValidationError):
            CounterSet(name="s", counters=bad)
    with pytest.raises(ValidationError, match="DNS label"):
        CounterSet(name="Card", counters={"c": "1"})


def test_a_device_consumes_from_at_most_two_sets_each_once() -> None:
    one = CounterConsumption(counter_set="a", counters={"c": "1"})
    two = CounterConsumption(counter_set="b", counters={"c": "1"})
    Device(id="d", consumes_counters=(one, two))
    with pytest.raises(ValidationError, match="at most 2"):
        Device(id="d", consumes_counters=(one, two, CounterConsumption(counter_set="c", counters={"c": "1"})))
    with pytest.raises(ValidationError, match="each once"):
        Device(id="d", consumes_counters=(one, one))


def test_counter_sets_go_first_in_slices_of_their_own() -> None:
    sets = [counter_set_entry(CounterSet(name=f"s{i}", counters={"c": "1"})) for i in range(10)]
    devices: list[dict[str, Any]] = [{"name": f"d{i}", "consumesCounters": [{}]} for i in range(70)]
    parts = chunks(devices, sets)
    assert [(type(p).__name__, len(p)) for p in parts] == [
        ("CounterSlice", 8),
        ("CounterSlice", 2),
        ("list", 64),
        ("list", 6),
    ]
    pool = Pool(DRIVER, NODE, "uid")
    assert "devices" not in pool.spec(1, 4, parts[0])
    assert pool.spec(1, 4, parts[0])["sharedCounters"][0] == {"name": "s0", "counters": {"c": {"value": "1"}}}
    assert "sharedCounters" not in pool.spec(1, 4, parts[2])
    assert chunks([], [sets[0]]) == [CounterSlice([sets[0]])]


def _slices(api: FakeKubeAPI) -> list[dict[str, Any]]:
    return sorted(
        (s["spec"] for s in api.slices(node=NODE, driver=DRIVER)),
        key=lambda spec: "devices" in spec,
    )


async def test_partitions_and_their_counter_set_are_published(short_dir: Path) -> None:
    whole = Device(
        id="whole",
        consumes_counters=(CounterConsumption(counter_set="card-0", counters=CARD.counters),),
        shared_counters=(CARD,),
    )
    plugin = Widgets(devices=[whole, half(0), half(1)])
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([plugin], api, short_dir):
            await wait_until(lambda: len(api.slices(node=NODE, driver=DRIVER)) == 2)
            counters, devices = _slices(api)
    assert counters["pool"]["resourceSliceCount"] == devices["pool"]["resourceSliceCount"] == 2
    assert counters["sharedCounters"] == [
        {
            "name": "card-0",
            "counters": {
                "cores": {"value": "8"},
                "memory": {"value": "16Gi"},
                "slice0": {"value": "1"},
                "slice1": {"value": "1"},
            },
        }
    ]
    by_name = {d["name"]: d for d in devices["devices"]}
    assert by_name["half-1"]["consumesCounters"] == [
        {
            "counterSet": "card-0",
            "counters": {"cores": {"value": "4"}, "memory": {"value": "8Gi"}, "slice1": {"value": "1"}},
        }
    ]
    assert by_name["whole"]["consumesCounters"][0]["counters"] == counters["sharedCounters"][0]["counters"]


async def test_undeclared_counters_and_conflicting_sets_are_said(short_dir: Path) -> None:
    stray = Device(
        id="stray", consumes_counters=(CounterConsumption(counter_set="card-9", counters={"cores": "1"}),)
    )
    greedy = Device(
        id="greedy", consumes_counters=(CounterConsumption(counter_set="card-0", counters={"gpus": "1"}),)
    )
    other = Device(id="other", shared_counters=(CounterSet(name="card-0", counters={"cores": "2"}),))
    plugin = Widgets(devices=[half(0), stray, greedy, other])
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([plugin], api, short_dir):
                await wait_until(lambda: len(api.slices(node=NODE, driver=DRIVER)) == 2)
                _counters, devices = _slices(api)
    assert sorted(d["name"] for d in devices["devices"]) == ["half-0", "other"]
    refused = {e["device"]: e["error"] for e in logs if e["event"] == "device_not_published"}
    assert refused == {
        "stray": "consumes from counter set card-9, which no device declares",
        "greedy": "consumes counters gpus that set card-0 does not have",
    }
    assert [e["counter_set"] for e in logs if e["event"] == "counter_set_conflict"] == ["card-0"]
