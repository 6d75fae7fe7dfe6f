"""FakeKubeAPI.allocate_claim honours shared counters (DRAPartitionableDevices) as the scheduler does."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import lightkube
import pytest
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice

from devplug._quantity import quantity
from devplug.testing import AllocationError, FakeKubeAPI
from devplug.testing._kubeapi import scheduler as _kubeapi_scheduler
from tests.testing.kubeapi.test_kubeapi_kit import DRIVER, NODE, device, slice_body

pytestmark = pytest.mark.anyio

SET = "gpu-0-counter-set"


def counters(**values: str) -> dict[str, dict[str, str]]:
    """``{counter: {value: quantity}}``; ``memory_slice_0`` names ``memory-slice-0``."""
    return {name.replace("_", "-"): {"value": v} for name, v in values.items()}


def part(name: str, counter_set: str = SET, **values: str) -> dict[str, Any]:
    """A device consuming ``values`` from ``counter_set``."""
    return device(name, consumesCounters=[{"counterSet": counter_set, "counters": counters(**values)}])


async def publish(
    client: lightkube.AsyncClient,
    devices: list[dict[str, Any]],
    sets: dict[str, dict[str, str]] | None = None,
) -> None:
    """A pool of two slices, as Kubernetes 1.35 wants it: the counter sets, then the devices."""
    sets = sets if sets is not None else {SET: {"memory_slice_0": "1", "memory_slice_1": "1"}}
    shared = [{"name": name, "counters": counters(**values)} for name, values in sets.items()]
    await client.create(ResourceSlice.from_dict(slice_body("s0", count=2, devices=[], sharedCounters=shared)))
    await client.create(ResourceSlice.from_dict(slice_body("s1", count=2, devices=devices)))


def devices_of(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def allocate(api: FakeKubeAPI, name: str, **kwargs: Any) -> list[str]:
    return devices_of(api.allocate_claim("ns", name, node=NODE, driver=DRIVER, **kwargs))


async def test_devices_sharing_a_counter_are_not_both_given_to_one_claim(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(
        client, [part("x", memory_slice_0="1"), part("y", memory_slice_0="1"), part("z", memory_slice_1="1")]
    )
    api.add_claim("ns", "two", requests=[("gpu", 2)])
    assert allocate(api, "two") == ["x", "z"]  # y is skipped: first fit goes on to z
    api.add_claim("ns", "three", requests=[("gpu", 3)])
    with pytest.raises(AllocationError) as error:
        allocate(api, "three")
    assert str(error.value).endswith(
        "request gpu needs 3 device(s), 0 usable: device x is allocated to claim ns/two; "
        f"device y: counter set {SET}: memory-slice-0 exhausted; device z is allocated to claim ns/two"
    )


async def test_devices_sharing_a_counter_are_not_given_to_two_claims(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(
        client, [part("x", memory_slice_0="1"), part("y", memory_slice_0="1"), part("z", memory_slice_1="1")]
    )
    for name in ("a", "b", "c"):
        api.add_claim("ns", name)
    api.add_claim("ns", "named", requests=[("gpu", ["y"])])
    assert allocate(api, "a") == ["x"]
    with pytest.raises(AllocationError, match=f"device y: counter set {SET}: memory-slice-0 exhausted"):
        allocate(api, "named")
    assert allocate(api, "b") == ["z"]
    with pytest.raises(
        AllocationError, match="memory-slice-0 exhausted; device z is allocated to claim ns/b"
    ):
        allocate(api, "c")


async def test_devices_on_disjoint_counters_are_all_given(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    sets = {SET: {"memory": "10Gi"}, "gpu-1-counter-set": {"memory": "10Gi"}}
    await publish(
        client,
        [part("x", memory="10Gi"), part("y", "gpu-1-counter-set", memory="10Gi"), device("whole")],
        sets,
    )
    api.add_claim("ns", "c", requests=[("gpu", 3)])
    assert allocate(api, "c") == ["x", "y", "whole"]


async def test_a_consumption_over_the_sets_value_is_never_allocatable(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(
        client, [part("huge", memory="11Gi"), part("fits", memory="10Gi")], {SET: {"memory": "10Gi"}}
    )
    api.add_claim("ns", "c", requests=[("gpu", ["huge"])])
    with pytest.raises(AllocationError, match=f"device huge: counter set {SET}: memory exhausted"):
        allocate(api, "c")
    assert allocate(api, "c", devices=["fits"]) == ["fits"]


async def test_a_deleted_or_deallocated_claim_frees_its_counters(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, [part("x", memory_slice_0="1"), part("y", memory_slice_0="1")])
    for name in ("a", "b", "c"):
        api.add_claim("ns", name)
    assert allocate(api, "a") == ["x"]
    with pytest.raises(AllocationError, match="memory-slice-0 exhausted"):
        allocate(api, "b")
    api.delete_claim("ns", "a")
    assert allocate(api, "b") == ["x"]
    # Deallocated through the API (status without allocation, as the scheduler writes it back).
    claim = (await client.get(ResourceClaim, "b", namespace="ns")).to_dict()
    await client.replace(ResourceClaimStatus.from_dict({**claim, "status": {}}), namespace="ns")
    assert "allocation" not in (api.claim("ns", "b").get("status") or {})
    assert allocate(api, "c") == ["x"]


@pytest.mark.parametrize(
    ("consumption", "why"),
    [
        (
            {"counterSet": "gpu-9-counter-set", "counters": counters(memory_slice_0="1")},
            "counter set gpu-9-counter-set not found",
        ),
        (
            {"counterSet": SET, "counters": counters(memory_slice_7="1")},
            f"counter memory-slice-7 not found in counter set {SET}",
        ),
    ],
)
async def test_an_unresolved_consumption_makes_the_pool_invalid(
    api: FakeKubeAPI, client: lightkube.AsyncClient, consumption: dict[str, Any], why: str
) -> None:
    await publish(client, [device("x", consumesCounters=[consumption]), part("y", memory_slice_0="1")])
    api.add_claim("ns", "c")
    with pytest.raises(AllocationError) as error:
        allocate(api, "c")
    assert str(error.value).endswith(f"for driver {DRIVER}: pool {NODE} is invalid: {why}")


async def test_a_counter_set_twice_makes_the_pool_invalid(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    shared = [{"name": SET, "counters": counters(memory_slice_0="1")}]
    for name in ("s0", "s1"):
        await client.create(
            ResourceSlice.from_dict(slice_body(name, count=3, devices=[], sharedCounters=shared))
        )
    await client.create(
        ResourceSlice.from_dict(slice_body("s2", count=3, devices=[part("x", memory_slice_0="1")]))
    )
    api.add_claim("ns", "c")
    with pytest.raises(AllocationError, match=f"pool {NODE} is invalid: duplicate counter set name {SET}"):
        allocate(api, "c")


async def test_quantities_with_different_suffixes_compare_exactly(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(
        client,
        [part("a", memory="512Mi"), part("b", memory="0.5Gi"), part("c", memory="1"), part("d", memory="1m")],
        {SET: {"memory": "1Gi"}},
    )
    api.add_claim("ns", "full", requests=[("gpu", 2)])
    assert allocate(api, "full") == ["a", "b"]  # 512Mi + 0.5Gi == 1Gi: the whole set, not more
    api.add_claim("ns", "more")
    with pytest.raises(
        AllocationError, match=r"device c: .* memory exhausted; device d: .* memory exhausted"
    ):
        allocate(api, "more")


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("1Gi", "1024Mi"),
        ("1Gi", "1073741824"),
        ("0.5Gi", "512Mi"),
        ("1k", "1000"),
        ("1e3", "1k"),
        ("1E3", "1000"),
        ("1E", "1e18"),
        ("1Ei", 2**60),
        ("500m", "0.5"),
        ("1n", "0.001u"),
        (".5Ki", 512),
        ("+2M", "2000k"),
        (1.5, "1500m"),
    ],
)
def test_quantity_values(left: object, right: object) -> None:
    assert quantity(left) == quantity(right)


def test_quantities_are_exact_where_floats_are_not() -> None:
    assert quantity("1Ei") + quantity("1") - quantity("1Ei") == 1
    assert quantity("0.1") + quantity("0.2") == quantity("300m")
    assert quantity("1n") * 1000 == quantity("1u") > Decimal(0)


@pytest.mark.parametrize("bad", ["", "Gi", "1.5.5", "1Gb", "1 Gi", "1e", True, None])
def test_what_is_not_a_quantity(bad: object) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        quantity(bad)


async def test_admin_access_results_of_other_claims_consume_nothing(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, [part("x", memory_slice_0="1"), part("y", memory_slice_0="1")])
    exactly = {
        "deviceClassName": "gpu.example.com",
        "allocationMode": "ExactCount",
        "count": 1,
        "adminAccess": True,
    }
    monitor = {
        "metadata": {"name": "monitor", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    await client.create(ResourceClaim.from_dict(monitor))
    assert allocate(api, "monitor") == ["x"]
    api.add_claim("ns", "user")
    assert allocate(api, "user") == ["x"]


async def test_where_first_fit_blocks_itself_the_search_goes_on(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    # "big" takes both memory slices: first fit's pick for "a" would leave "b" nothing.
    await publish(
        client,
        [
            part("big", memory_slice_0="1", memory_slice_1="1"),
            part("x", memory_slice_0="1"),
            part("y", memory_slice_1="1"),
        ],
    )
    api.add_claim("ns", "two", requests=[("gpu", 2)])
    assert allocate(api, "two") == ["x", "y"]
    api.delete_claim("ns", "two")
    api.add_claim("ns", "split", requests=[("a", 1), ("b", 1)])
    results = api.allocate_claim("ns", "split", node=NODE, driver=DRIVER)["status"]["allocation"]["devices"][
        "results"
    ]
    assert [(r["request"], r["device"]) for r in results] == [("a", "x"), ("b", "y")]
    api.add_claim("ns", "more", requests=[("gpu", 2)])
    with pytest.raises(AllocationError, match="request gpu needs 2 device"):
        allocate(api, "more")  # nothing is left: every choice fails, first fit's refusal is told


async def test_without_counters_first_fit_alone_decides(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await client.create(ResourceSlice.from_dict(slice_body(devices=[device("gpu-0"), device("gpu-1")])))
    api.add_claim("ns", "c", requests=[("gpu", 3)])
    with pytest.raises(AllocationError, match=r"request gpu needs 3 device\(s\), 2 usable: no more devices"):
        allocate(api, "c")


async def test_an_admin_access_pick_is_counted_as_the_allocator_counts_it(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    # The allocator checks an adminAccess pick's counters too: on a device another claim holds,
    # its consumption is counted twice, so the pick does not fit.
    await publish(client, [part("x", memory_slice_0="1"), part("y", memory_slice_1="1")])
    exactly = {
        "deviceClassName": "gpu.example.com",
        "allocationMode": "ExactCount",
        "count": 1,
        "adminAccess": True,
    }
    for name in ("watch-x", "watch-y"):
        body = {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        await client.create(ResourceClaim.from_dict(body))
    api.add_claim("ns", "user")
    assert allocate(api, "user") == ["x"]
    with pytest.raises(AllocationError, match=f"device x: counter set {SET}: memory-slice-0 exhausted"):
        allocate(api, "watch-x", devices=["x"])
    assert allocate(api, "watch-y") == ["y"]  # x does not fit; y's counters are free


async def test_a_search_that_gives_up_tells_first_fits_refusal(
    api: FakeKubeAPI, client: lightkube.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await publish(
        client,
        [
            part("big", memory_slice_0="1", memory_slice_1="1"),
            part("x", memory_slice_0="1"),
            part("y", memory_slice_1="1"),
        ],
    )
    monkeypatch.setattr(_kubeapi_scheduler, "SEARCH_LIMIT", 2)  # big, then x: never y
    api.add_claim("ns", "two", requests=[("gpu", 2)])
    with pytest.raises(
        AllocationError, match=f"1 usable: device x: counter set {SET}: memory-slice-0 exhausted"
    ):
        allocate(api, "two")
    monkeypatch.setattr(_kubeapi_scheduler, "SEARCH_LIMIT", 5)  # big, x, y; x, y
    assert allocate(api, "two") == ["x", "y"]
