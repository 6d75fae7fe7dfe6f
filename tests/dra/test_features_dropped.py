"""1.36/1.37 fields an API server may drop (its gate off, or older than the field): shared devices,
binding conditions, partitionTypeAttribute. The driver notices from the server's answer, says so
once, and publishes what stays safe, without a write loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import Device
from devplug.dra import CapacityRequestPolicy, CounterConsumption, CounterSet, DraDriver
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"
SHARED = Device(
    id="shared",
    capacity={"shares": "4"},
    allow_multiple_allocations=True,
    request_policies={"shares": CapacityRequestPolicy(default="1")},
)
BOUND = Device(
    id="bound",
    binding_conditions=(f"{DRIVER}/attached",),
    binding_failure_conditions=(f"{DRIVER}/failed",),
)
CARD = CounterSet(name="card-0", counters={"cores": "8"})
PART = Device(
    id="half",
    attributes={"profile": "half"},
    consumes_counters=(CounterConsumption(counter_set="card-0", counters={"cores": "4"}),),
    shared_counters=(CARD,),
)
PLAIN = Device(id="plain")


class Partitions(Widgets):
    dra_partition_type_attribute: ClassVar[str | None] = "profile"


def devices(api: FakeKubeAPI) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d for s in api.slices(node=NODE, driver=DRIVER) for d in s["spec"].get("devices") or ()
    }


def specs(api: FakeKubeAPI) -> list[dict[str, Any]]:
    return [s["spec"] for s in api.slices(node=NODE, driver=DRIVER)]


async def quiet(api: FakeKubeAPI, driver: DraDriver) -> int:
    """Slice writes during a second once the driver is in sync: none, if it stopped sending what
    the server drops."""
    await wait_until(lambda: driver.debug_state()["slices"]["in_sync"])
    before = len(api.requests)
    await anyio.sleep(1)
    return sum(1 for r in api.requests[before:] if r.verb in ("create", "update", "patch"))


async def test_a_server_with_every_1_37_gate_on_keeps_shares_and_binding_conditions(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([Widgets(devices=[SHARED, BOUND, PLAIN])], api, short_dir) as driver:
            await wait_until(lambda: len(devices(api)) == 3)
            assert devices(api)["shared"]["allowMultipleAllocations"] is True
            assert devices(api)["bound"]["bindingConditions"] == [f"{DRIVER}/attached"]
            state = driver.debug_state()["slices"]
            assert (state["shares_supported"], state["bindings_supported"]) == (True, True)


async def test_without_consumable_capacity_shared_devices_are_published_as_ordinary_ones(
    short_dir: Path,
) -> None:
    async with FakeKubeAPI(consumable_capacity=False) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([Widgets(devices=[SHARED, PLAIN])], api, short_dir) as driver:
                await wait_until(lambda: driver.debug_state()["slices"]["shares_supported"] is False)
                await wait_until(lambda: driver.debug_state()["slices"]["in_sync"])
                assert devices(api)["shared"] == {
                    "name": "shared",
                    "attributes": devices(api)["shared"]["attributes"],
                    "capacity": {"shares": {"value": "4"}},
                }
                assert await quiet(api, driver) == 0
        assert [e["event"] for e in logs].count("shared_devices_dropped") == 1


async def test_without_binding_conditions_their_devices_are_left_out(short_dir: Path) -> None:
    async with FakeKubeAPI(binding_conditions=False) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([Widgets(devices=[BOUND, PLAIN])], api, short_dir) as driver:
                await wait_until(lambda: sorted(devices(api)) == ["plain"])
                assert driver.debug_state()["slices"]["bindings_supported"] is False
                assert await quiet(api, driver) == 0
        assert [e["event"] for e in logs].count("binding_conditions_dropped") == 1


@pytest.mark.parametrize("gate", [False, True])
async def test_the_partition_type_attribute_goes_where_the_server_keeps_it(
    short_dir: Path, gate: bool
) -> None:
    async with FakeKubeAPI(partitionable_devices_type=gate) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([Partitions(devices=[PART, PLAIN])], api, short_dir) as driver:
                await wait_until(lambda: sorted(devices(api)) == ["half", "plain"])
                await wait_until(
                    lambda: (
                        driver.debug_state()["slices"]["partition_types_supported"] is gate
                        and driver.debug_state()["slices"]["in_sync"]
                    )
                )
                kept = [s.get("partitionTypeAttribute") for s in specs(api) if "devices" in s]
                assert kept == ([f"{DRIVER}/profile"] if gate else [None])
                assert await quiet(api, driver) == 0
        assert [e["event"] for e in logs].count("partition_type_attribute_dropped") == (0 if gate else 1)


async def test_a_partition_without_its_type_is_not_published(short_dir: Path) -> None:
    untyped = PART.model_copy(update={"id": "untyped", "attributes": {}})
    async with FakeKubeAPI(partitionable_devices_type=True) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([Partitions(devices=[PART, untyped, PLAIN])], api, short_dir):
                await wait_until(lambda: sorted(devices(api)) == ["half", "plain"])
        problems = [e for e in logs if e["event"] == "device_not_published"]
        assert problems[0]["device"] == "untyped"
        assert "has no attribute profile" in problems[0]["error"]


LISTED = Device(id="listed", numa_nodes=(0, 1), attributes={"links": (2, 3), "model": "w"})


@pytest.mark.parametrize("gate", [False, True])
async def test_list_attributes_are_published_where_the_server_takes_them(short_dir: Path, gate: bool) -> None:
    """list_attributes on: lists, and numaNode listing every node, where DRAListTypeAttributes is
    on; a server without it drops the values and refuses the empty attribute, so the driver
    leaves them out, says so once, and publishes numaNode as the first node."""
    async with FakeKubeAPI(list_type_attributes=gate) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving(
                [Widgets(devices=[LISTED, PLAIN])], api, short_dir, list_attributes=True
            ) as driver:
                await wait_until(lambda: sorted(devices(api)) == ["listed", "plain"])
                assert driver.debug_state()["slices"]["lists_supported"] is gate
                attributes = devices(api)["listed"]["attributes"]
                assert await quiet(api, driver) == 0
        if gate:
            assert attributes["links"] == {"ints": [2, 3]}
            assert attributes["resource.kubernetes.io/numaNode"] == {"ints": [0, 1]}
        else:
            assert "links" not in attributes
            assert attributes["resource.kubernetes.io/numaNode"] == {"int": 0}
            assert [e["event"] for e in logs].count("list_attributes_refused") == 1
        assert attributes["model"] == {"string": "w"}


async def test_without_list_attributes_lists_are_left_out_and_said_so(short_dir: Path) -> None:
    async with FakeKubeAPI(list_type_attributes=True) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([Widgets(devices=[LISTED])], api, short_dir):
                await wait_until(lambda: sorted(devices(api)) == ["listed"])
        attributes = devices(api)["listed"]["attributes"]
        assert "links" not in attributes
        assert attributes["resource.kubernetes.io/numaNode"] == {"int": 0}
        (note,) = [e for e in logs if e["event"] == "list_attributes_left_out"]
        assert note["devices"] == {"listed": ["links"]}
