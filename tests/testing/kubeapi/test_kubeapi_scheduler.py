"""FakeKubeAPI.allocate_claim: the scheduler's rules for pools, generations, taints and taken devices."""

from __future__ import annotations

from typing import Any

import lightkube
import pytest
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from devplug.testing import AllocationError, FakeKubeAPI
from tests.testing.kubeapi.test_kubeapi_kit import DRIVER, NODE, device, slice_body

pytestmark = pytest.mark.anyio


async def publish(client: lightkube.AsyncClient, name: str = "s1", **kwargs: Any) -> None:
    await client.create(ResourceSlice.from_dict(slice_body(name, **kwargs)))


def devices_of(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


async def test_allocation_as_the_scheduler_writes_it(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await publish(client, devices=[device("gpu-0"), device("gpu-1")])
    before = api.add_claim("ns", "c", requests=[("gpu", 1)])
    claim = api.allocate_claim(
        "ns", "c", node=NODE, driver=DRIVER, config=[{"mode": "shared"}], pod_uid="p-1"
    )
    allocation = claim["status"]["allocation"]
    assert allocation["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    ]
    assert allocation["devices"]["config"] == [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"mode": "shared"}}}
    ]
    assert allocation["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
    }
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "c-pod", "uid": "p-1"}]
    assert int(claim["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    read = await client.get(ResourceClaim, "c", namespace="ns")  # what a driver reads
    assert read.status.allocation.devices.results[0].device == "gpu-0"
    with pytest.raises(AllocationError, match="already allocated"):
        api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)


async def test_an_incomplete_pool_is_not_used(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await publish(client, "s1", count=2)
    api.add_claim("ns", "c")
    with pytest.raises(
        AllocationError, match=r"pool node-1 is incomplete: 1 of 2 ResourceSlices at generation 0"
    ):
        api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)
    await publish(client, "s2", count=2, devices=[device("gpu-1")])
    assert devices_of(api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)) == ["gpu-0"]


async def test_older_generations_are_ignored(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await publish(client, "old", generation=1, devices=[device("gpu-old")])
    await publish(client, "new", generation=2, devices=[device("gpu-new")])
    api.add_claim("ns", "a")
    api.add_claim("ns", "b")
    with pytest.raises(AllocationError, match="device gpu-old is not in a usable pool"):
        api.allocate_claim("ns", "a", node=NODE, driver=DRIVER, devices=["gpu-old"])
    assert devices_of(api.allocate_claim("ns", "a", node=NODE, driver=DRIVER)) == ["gpu-new"]
    with pytest.raises(AllocationError, match="request gpu needs 1 device"):
        api.allocate_claim("ns", "b", node=NODE, driver=DRIVER)


async def test_tainted_devices_are_skipped(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    hot = {"key": "example.com/unhealthy", "value": "xid", "effect": "NoExecute"}
    noted = {"key": "example.com/note", "effect": "None"}
    await publish(client, devices=[device("gpu-0", taints=[hot]), device("gpu-1", taints=[noted])])
    api.add_claim("ns", "c", requests=[("gpu", 2)])
    with pytest.raises(
        AllocationError, match=r"device gpu-0 has the taint example\.com/unhealthy=xid:NoExecute"
    ):
        api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)
    assert devices_of(api.allocate_claim("ns", "c", node=NODE, driver=DRIVER, count=1)) == ["gpu-1"]


async def test_taken_devices_are_not_given_twice(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await publish(client, devices=[device("gpu-0"), device("gpu-1")])
    for name in ("a", "b", "c"):
        api.add_claim("ns", name)
    assert devices_of(api.allocate_claim("ns", "a", node=NODE, driver=DRIVER)) == ["gpu-0"]
    assert devices_of(api.allocate_claim("ns", "b", node=NODE, driver=DRIVER)) == ["gpu-1"]
    with pytest.raises(AllocationError, match="device gpu-0 is allocated to claim ns/a"):
        api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)
    api.delete_claim("ns", "a")
    assert devices_of(api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)) == ["gpu-0"]


async def test_admin_access_results_do_not_take_the_device(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, devices=[device("gpu-0")])
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
    watched = api.allocate_claim("ns", "monitor", node=NODE, driver=DRIVER)
    assert watched["status"]["allocation"]["devices"]["results"][0]["adminAccess"] is True
    api.add_claim("ns", "user")
    assert devices_of(api.allocate_claim("ns", "user", node=NODE, driver=DRIVER)) == ["gpu-0"]


async def test_named_devices_and_other_nodes(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    api.add_node("node-2")
    await publish(client, devices=[device("gpu-0"), device("gpu-1")])
    await publish(client, "far", node="node-2", devices=[device("gpu-9")])
    api.add_claim("ns", "by-name", requests=[("gpu", ["gpu-1"])])
    assert devices_of(api.allocate_claim("ns", "by-name", node=NODE, driver=DRIVER)) == ["gpu-1"]
    api.add_claim("ns", "far")
    with pytest.raises(AllocationError, match="device gpu-9 is not in a usable pool"):
        api.allocate_claim("ns", "far", node=NODE, driver=DRIVER, devices=["gpu-9"])
    with pytest.raises(
        AllocationError, match=r"no ResourceSlice of driver other\.example\.com for node node-1"
    ):
        api.allocate_claim("ns", "far", node=NODE, driver="other.example.com")


async def test_several_requests_share_out_named_devices(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, devices=[device(f"gpu-{i}") for i in range(3)])
    api.add_claim("ns", "first-fit", requests=[("a", 1), ("b", 2)])
    allocated = api.allocate_claim("ns", "first-fit", node=NODE, driver=DRIVER)
    results = allocated["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in results] == [("a", "gpu-0"), ("b", "gpu-1"), ("b", "gpu-2")]
    api.delete_claim("ns", "first-fit")
    api.add_claim("ns", "named", requests=[("a", 1), ("b", 2)])
    allocated = api.allocate_claim(
        "ns", "named", node=NODE, driver=DRIVER, devices=["gpu-2", "gpu-0", "gpu-1"]
    )
    results = allocated["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in results] == [("a", "gpu-2"), ("b", "gpu-0"), ("b", "gpu-1")]


async def test_a_pool_with_a_device_twice_is_invalid(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await publish(client, "s1", count=2)
    await publish(client, "s2", count=2)  # gpu-0 again
    api.add_claim("ns", "c")
    with pytest.raises(AllocationError, match="pool node-1 is invalid"):
        api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)


async def test_a_replaced_claim_is_a_new_unallocated_claim(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client)
    old = api.add_claim("ns", "c")
    api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)
    new = api.replace_claim("ns", "c")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert "status" not in new
    assert devices_of(api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)) == ["gpu-0"]  # freed
    with pytest.raises(LookupError):
        api.delete_claim("ns", "missing")
