"""FakeKubeAPI and 1.37's binding conditions, partitionTypeAttribute and claim device status:
validated with the API server's rules and words, dropped where their gates are off, and binding
conditions carried into the allocation as the scheduler does."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx2
import pytest

from devplug.testing import FakeKubeAPI
from devplug.testing._kubeapi.validation import validate_slice
from tests.testing.kubeapi.test_kubeapi_kit import DRIVER, NODE, device, post_slice, raw, slice_body

pytestmark = pytest.mark.anyio

ATTACHED, FAILED = f"{DRIVER}/attached", f"{DRIVER}/failed"
CONSUMES = [{"counterSet": "card-0", "counters": {"cores": {"value": "4"}}}]


def errors_of(body: dict[str, Any]) -> list[str]:
    return [f"{e.field}: {e.body}" for e in validate_slice(body)]


def bound(**fields: Any) -> dict[str, Any]:
    return device(
        "gpu-0", **{"bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED], **fields}
    )


@pytest.mark.parametrize(
    ("fields", "wanted"),
    [
        ({}, []),
        (
            {"bindingFailureConditions": []},
            [
                "spec.devices[0].bindingFailureConditions: Invalid value: []: "
                "bindingFailureConditions are required to use bindingConditions"
            ],
        ),
        (
            {"bindingFailureConditions": [ATTACHED]},
            [
                f'spec.devices[0].bindingFailureConditions[0]: Invalid value: "{ATTACHED}": '
                "bindingFailureConditions must not overlap with bindingConditions"
            ],
        ),
        (
            {"bindingConditions": [ATTACHED, ATTACHED]},
            [f'spec.devices[0].bindingConditions[1]: Duplicate value: "{ATTACHED}"'],
        ),
        ({"bindingConditions": [f"c{i}" for i in range(5)]}, ["spec.devices[0].bindingConditions: Too many"]),
    ],
)
def test_binding_conditions_are_validated_as_the_api_server_does(
    fields: dict[str, Any], wanted: list[str]
) -> None:
    got = errors_of(slice_body(devices=[bound(**fields)]))
    assert [g[: len(w)] for g, w in zip(got, wanted, strict=False)] == wanted
    assert len(got) == len(wanted)


def test_the_partition_type_attribute_is_validated_where_the_gate_keeps_it() -> None:
    name = f"{DRIVER}/profile"
    parts = [
        device(
            "half-0", attributes={"profile": {"string": "half"}}, consumesCounters=copy.deepcopy(CONSUMES)
        ),
        device("half-1", consumesCounters=copy.deepcopy(CONSUMES)),
        device("whole", attributes={"profile": {"int": 1}}),
    ]
    assert errors_of(slice_body(devices=parts, partitionTypeAttribute=name)) == [
        f"spec.devices[1].attributes[{name}]: Required value: device consumes counters and "
        "`partitionTypeAttribute` names this attribute, so it must be set"
    ]
    assert errors_of(slice_body(devices=[device("whole")], partitionTypeAttribute=name)) == [
        f'spec.partitionTypeAttribute: Invalid value: "{name}": may only be set on a slice which '
        "declares devices that consume counters"
    ]
    assert errors_of(slice_body(devices=parts[:1], partitionTypeAttribute="profile")) == [
        'spec.partitionTypeAttribute: Invalid value: "profile": a fully qualified name must be a '
        "domain and a name separated by a slash"
    ]


async def test_gates_drop_binding_conditions_and_the_partition_type_attribute() -> None:
    name = f"{DRIVER}/profile"
    part = device(
        "half-0", attributes={"profile": {"string": "half"}}, consumesCounters=copy.deepcopy(CONSUMES)
    )
    body = slice_body(devices=[bound(), part], partitionTypeAttribute=name)
    counters = slice_body(
        "counters", devices=[], sharedCounters=[{"name": "card-0", "counters": {"cores": {"value": "8"}}}]
    )
    for gates, kept_binding, kept_type in [
        ({}, True, False),  # a default 1.37 server: binding conditions on, partition types off
        ({"binding_conditions": False, "partitionable_devices_type": True}, False, True),
    ]:
        async with FakeKubeAPI(**gates) as api, raw(api.url) as http:
            assert (await post_slice(http, counters)).status_code == 201
            answer = await post_slice(http, body)
            assert answer.status_code == 201, answer.text
            stored = answer.json()["spec"]
        assert ("bindingConditions" in stored["devices"][0]) is kept_binding
        assert ("bindsToNode" in stored["devices"][0]) is False
        assert ("partitionTypeAttribute" in stored) is kept_type


async def test_allocation_carries_the_device_s_binding_conditions() -> None:
    async with FakeKubeAPI() as api, raw(api.url) as http:
        api.add_node(NODE)
        answer = await post_slice(http, slice_body(devices=[bound()]))
        assert answer.status_code == 201, answer.text
        api.add_claim("ns", "c", requests=[("gpu", 1)])
        (result,) = api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)["status"]["allocation"][
            "devices"
        ]["results"]
    assert result["bindingConditions"] == [ATTACHED]
    assert result["bindingFailureConditions"] == [FAILED]


def condition(**fields: Any) -> dict[str, Any]:
    return {
        "type": ATTACHED,
        "status": "True",
        "reason": "Attached",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        **fields,
    }


async def write_status(
    api: FakeKubeAPI, http: httpx2.AsyncClient, entries: list[dict[str, Any]]
) -> httpx2.Response:
    claim = api.claim("ns", "c")
    claim["status"]["devices"] = entries
    return await http.put(
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
        content=json.dumps(claim),
        headers={"Content-Type": "application/json"},
    )


async def test_claim_device_status_is_validated_share_by_share() -> None:
    shared = device("gpu-0", allowMultipleAllocations=True, capacity={"shares": {"value": "2"}})
    async with FakeKubeAPI() as api, raw(api.url) as http:
        api.add_node(NODE)
        assert (await post_slice(http, slice_body(devices=[shared]))).status_code == 201
        api.add_claim("ns", "c", requests=[("gpu", 1)])
        (result,) = api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)["status"]["allocation"][
            "devices"
        ]["results"]
        share = result["shareID"]
        entry = {"driver": DRIVER, "pool": NODE, "device": "gpu-0", "shareID": share}
        ok = await write_status(
            api,
            http,
            [
                {
                    **entry,
                    "conditions": [condition()],
                    "data": {"k": "v"},
                    "networkData": {"ips": ["10.0.0.1/24"]},
                }
            ],
        )
        assert ok.status_code == 200, ok.text
        other_share = await write_status(
            api, http, [{**entry, "shareID": "6f1f7e3a-0000-4000-8000-000000000000"}]
        )
        assert other_share.status_code == 422
        assert "must be an allocated device in the claim" in other_share.text
        bad = await write_status(
            api,
            http,
            [
                {
                    **entry,
                    "conditions": [condition(status="Maybe", reason="not a reason")],
                    "data": {"blob": "x" * 11000},
                    "networkData": {"ips": ["10.0.0.1"], "interfaceName": "x" * 300},
                }
            ],
        )
        assert bad.status_code == 422, bad.text
        causes = {c["field"]: c["message"] for c in bad.json()["details"]["causes"]}
        assert causes["status.devices[0].conditions[0].status"].startswith('Unsupported value: "Maybe"')
        assert (
            "a condition reason must start with alphabetic character"
            in causes["status.devices[0].conditions[0].reason"]
        )
        assert causes["status.devices[0].data"] == "Too long: may not be more than 10240 bytes"
        assert "must be a valid address in CIDR form" in causes["status.devices[0].networkData.ips[0]"]
        assert causes["status.devices[0].networkData.interfaceName"].startswith("Too long")
