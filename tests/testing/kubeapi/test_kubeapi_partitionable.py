"""FakeKubeAPI(partitionable_devices=False): a server without DRAPartitionableDevices drops the
shared counters and per-device node selection before validation, and refuses what is then invalid."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx2
import pytest

from devplug.testing import FakeKubeAPI
from devplug.testing._kubeapi.strategy import Gates, drop_disabled_fields
from tests.testing.kubeapi.test_kubeapi_kit import SLICES, device, post_slice, raw, slice_body, taint

pytestmark = pytest.mark.anyio

COUNTERS = [{"name": "card-0", "counters": {"cores": {"value": "8"}, "memory": {"value": "16Gi"}}}]
CONSUMES = [{"counterSet": "card-0", "counters": {"cores": {"value": "4"}}}]


def half(name: str, **fields: Any) -> dict[str, Any]:
    """A partition that consumes half of card 0's cores, with an attribute and a capacity."""
    return device(
        name,
        attributes={"model": {"string": "w"}},
        capacity={"memory": {"value": "8Gi"}},
        consumesCounters=copy.deepcopy(CONSUMES),
        **fields,
    )


def counter_slice() -> dict[str, Any]:
    body = slice_body("counters", devices=None, sharedCounters=copy.deepcopy(COUNTERS))
    del body["spec"]["devices"]
    return body


def per_device_slice() -> dict[str, Any]:
    """A pool whose devices name their nodes themselves (perDeviceNodeSelection)."""
    body = slice_body("per-device", node=None, pool="shared", perDeviceNodeSelection=True)
    body["spec"]["devices"] = [device("gpu-0", allNodes=True), device("gpu-1", nodeName="node-1")]
    return body


async def put_slice(http: httpx2.AsyncClient, body: dict[str, Any]) -> httpx2.Response:
    return await http.put(
        f"{SLICES}/{body['metadata']['name']}",
        content=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )


@pytest.mark.parametrize("gate", [True, False])
async def test_a_slice_of_counter_sets_is_stored_empty_without_the_gate(gate: bool) -> None:
    async with FakeKubeAPI(partitionable_devices=gate) as api, raw(api.url) as http:
        answer = await post_slice(http, counter_slice())
        (stored,) = api.slices()
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"] == stored["spec"]
    if gate:
        assert stored["spec"]["sharedCounters"] == COUNTERS
    else:
        # Nothing requires devices or counter sets: the slice is valid, and empty.
        assert "sharedCounters" not in stored["spec"]
        assert "devices" not in stored["spec"]
        assert stored["spec"]["nodeName"] == "node-1"


@pytest.mark.parametrize("gate", [True, False])
async def test_devices_lose_their_counter_consumption_and_keep_the_rest(gate: bool) -> None:
    body = slice_body(devices=[half("half-0"), half("half-1"), device("plain")])
    async with FakeKubeAPI(partitionable_devices=gate) as api, raw(api.url) as http:
        answer = await post_slice(http, body)
        (stored,) = api.slices()
    assert answer.status_code == 201, answer.text
    devices = {d["name"]: d for d in stored["spec"]["devices"]}
    assert sorted(devices) == ["half-0", "half-1", "plain"]
    assert ("consumesCounters" in devices["half-0"]) is gate
    assert devices["half-1"]["attributes"] == {"model": {"string": "w"}}
    assert devices["half-1"]["capacity"] == {"memory": {"value": "8Gi"}}


async def test_per_device_node_selection_is_dropped_and_the_slice_then_refused() -> None:
    async with FakeKubeAPI(partitionable_devices=False) as api, raw(api.url) as http:
        answer = await post_slice(http, per_device_slice())
    assert answer.status_code == 422
    causes = answer.json()["details"]["causes"]
    assert [(c["reason"], c["field"]) for c in causes] == [("FieldValueRequired", "spec")]
    assert (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
        in (causes[0]["message"])
    )
    assert api.slices() == []


async def test_per_device_node_selection_with_the_gate_is_stored() -> None:
    async with FakeKubeAPI() as api, raw(api.url) as http:
        answer = await post_slice(http, per_device_slice())
        (stored,) = api.slices()
    assert answer.status_code == 201, answer.text
    assert stored["spec"]["perDeviceNodeSelection"] is True
    assert [d.get("allNodes") for d in stored["spec"]["devices"]] == [True, None]
    assert [d.get("nodeName") for d in stored["spec"]["devices"]] == [None, "node-1"]


def _devices_and_counters() -> dict[str, Any]:
    return slice_body(devices=[device("gpu-0")], sharedCounters=copy.deepcopy(COUNTERS))


def _many_consumers() -> dict[str, Any]:
    return slice_body(devices=[half(f"half-{i}") for i in range(100)])


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (_devices_and_counters, "spec"),  # only one of devices and sharedCounters (1.35)
        (_many_consumers, "spec.devices"),  # 64 devices at most when any consumes counters
    ],
)
async def test_validation_sees_the_slice_after_the_drop(make: Any, field: str) -> None:
    async with FakeKubeAPI() as on, raw(on.url) as http:
        refused = await post_slice(http, make())
    async with FakeKubeAPI(partitionable_devices=False) as off, raw(off.url) as http:
        accepted = await post_slice(http, make())
        (stored,) = off.slices()
    assert refused.status_code == 422
    assert [c["field"] for c in refused.json()["details"]["causes"]] == [field]
    assert accepted.status_code == 201, accepted.text
    assert "sharedCounters" not in stored["spec"]
    assert not any("consumesCounters" in d for d in stored["spec"]["devices"])


async def test_resending_dropped_counters_is_a_change_that_stores_nothing_new() -> None:
    async with FakeKubeAPI(partitionable_devices=False) as api, raw(api.url) as http:
        created = (await post_slice(http, slice_body(devices=[half("half-0")]))).json()
        assert created["metadata"]["generation"] == 1
        again = slice_body(devices=[half("half-0")])
        again["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        replaced = await put_slice(http, again)
        same = copy.deepcopy(replaced.json())
        kept = await put_slice(http, same)
    assert replaced.status_code == 200, replaced.text
    # The registry compares the spec as sent with the stored one before it drops anything.
    assert replaced.json()["metadata"]["generation"] == 2
    assert replaced.json()["spec"] == created["spec"]
    assert "consumesCounters" not in replaced.json()["spec"]["devices"][0]
    # The stored object sent back unchanged is a no-op: same generation and resourceVersion.
    assert kept.json()["metadata"]["generation"] == 2
    assert kept.json()["metadata"]["resourceVersion"] == replaced.json()["metadata"]["resourceVersion"]


async def test_the_two_gates_are_independent() -> None:
    tainted = half("half-0", taints=[taint()])
    async with FakeKubeAPI(partitionable_devices=False) as api, raw(api.url) as http:
        await post_slice(http, slice_body(devices=[tainted]))
        (stored,) = api.slices()
    assert stored["spec"]["devices"][0]["taints"] == [taint()]
    assert "consumesCounters" not in stored["spec"]["devices"][0]
    async with FakeKubeAPI(device_taints=False) as api, raw(api.url) as http:
        await post_slice(http, slice_body(devices=[tainted]))
        (stored,) = api.slices()
    assert "taints" not in stored["spec"]["devices"][0]
    assert stored["spec"]["devices"][0]["consumesCounters"] == CONSUMES


@pytest.mark.parametrize(
    ("old_spec", "kept"),
    [
        (None, False),  # a create
        ({"devices": [{"name": "plain"}]}, False),
        ({"sharedCounters": COUNTERS}, True),
        ({"devices": [{"name": "half-0", "consumesCounters": CONSUMES}]}, True),
        ({"perDeviceNodeSelection": True, "devices": [{"name": "d", "allNodes": True}]}, True),
        ({"devices": [{"name": "d", "nodeName": "node-1"}]}, True),
    ],
)
def test_an_update_keeps_the_fields_where_the_stored_slice_uses_them(
    old_spec: dict[str, Any] | None, kept: bool
) -> None:
    new = {"spec": {"sharedCounters": copy.deepcopy(COUNTERS), "devices": [half("half-0")]}}
    old = None if old_spec is None else {"spec": old_spec}
    drop_disabled_fields(new, old, gates=Gates(partitionable_devices=False))
    assert ("sharedCounters" in new["spec"]) is kept
    assert ("consumesCounters" in new["spec"]["devices"][0]) is kept
    assert new["spec"]["devices"][0]["capacity"] == {"memory": {"value": "8Gi"}}
