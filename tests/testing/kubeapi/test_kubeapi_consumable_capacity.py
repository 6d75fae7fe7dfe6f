"""Consumable capacity (KEP-5075, DRAConsumableCapacity, beta in 1.37) in FakeKubeAPI: the API
server's validation of ``allowMultipleAllocations`` and ``requestPolicy`` (the same tables run on a
real kube-apiserver), the fields a server without the gate drops, and the scheduler's shares of a
device in ``allocate_claim``."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx2
import lightkube
import pytest
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice

from devplug.testing import AllocationError, FakeKubeAPI
from devplug.testing._kubeapi import scheduler as _kubeapi_scheduler
from devplug.testing._kubeapi.names import QUANTITY_ERROR, Quantity
from devplug.testing._kubeapi.resources import KINDS
from devplug.testing._kubeapi.status import APIError
from devplug.testing._kubeapi.strategy import (
    Gates,
    drop_disabled_claim_status_fields,
    drop_disabled_fields,
    prepare_create,
    prepare_update,
)
from devplug.testing._kubeapi.validation import validate_slice
from tests.testing.kubeapi.real_api import Kube, RealAPI
from tests.testing.kubeapi.test_kubeapi_kit import (
    DRIVER,
    NODE,
    SLICES,
    Body,
    device,
    post_slice,
    slice_body,
    with_devices,
)

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
MEMORY = "spec.devices[0].capacity[memory]"
POLICY = f"{MEMORY}.requestPolicy"


def shared(name: str, *, multiple: bool | None = True, **capacity: Any) -> Body:
    """A device with ``capacity`` (a quantity, or ``(quantity, requestPolicy)``), shared by default."""
    caps: dict[str, Any] = {}
    for key, given in capacity.items():
        value, policy = given if isinstance(given, tuple) else (given, None)
        caps[key] = {"value": value, **({"requestPolicy": policy} if policy is not None else {})}
    body = device(name, capacity=caps)
    if multiple is not None:
        body["allowMultipleAllocations"] = multiple
    return body


def memory(
    policy: dict[str, Any], value: str = "8Gi", *, multiple: bool | None = True
) -> Callable[[Body], None]:
    """A slice whose one device has the capacity ``memory`` with ``policy``."""
    return with_devices(shared("gpu-0", multiple=multiple, memory=(value, policy)))


# -- validation --------------------------------------------------------------------------------------

VALID: list[tuple[str, Callable[[Body], None]]] = [
    ("shared, no policy", with_devices(shared("gpu-0", memory="8Gi", cores=4))),
    ("not shared, said so", with_devices(shared("gpu-0", multiple=False, memory="8Gi"))),
    ("shared, no capacity", with_devices(device("gpu-0", allowMultipleAllocations=True))),
    ("a default alone", memory({"default": "1Gi"})),
    ("valid values", memory({"default": "2Gi", "validValues": ["1Gi", "2Gi", "8Gi"]})),
    ("valid values in other units", memory({"default": "1024Mi", "validValues": ["512Mi", "1Gi"]})),
    (
        "range with every bound",
        memory({"default": "2Gi", "validRange": {"min": "1Gi", "max": "8Gi", "step": "1Gi"}}),
    ),
    ("range with a min only", memory({"default": "3Gi", "validRange": {"min": "1Gi"}})),
    ("range starting at zero", memory({"default": "0", "validRange": {"min": "0", "step": "2Gi"}})),
    (
        "a fractional step, checked in integers as a default 1.37 server does",
        memory({"default": "1", "validRange": {"min": "0", "step": "500m"}}, "4"),
    ),
]

INVALID: list[tuple[str, Callable[[Body], None], str, str]] = [
    (
        "a policy on a device that is not shared",
        memory({"default": "1Gi"}, multiple=None),
        POLICY,
        "Forbidden: allowMultipleAllocations must be true",
    ),
    (
        "a policy on a device shared false",
        memory({"default": "1Gi"}, multiple=False),
        POLICY,
        "Forbidden: allowMultipleAllocations must be true",
    ),
    (
        "values and a range",
        memory({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}}),
        POLICY,
        'Forbidden: exactly one policy can be specified, cannot specify "validValues" and "validRange" '
        "at the same time",
    ),
    (
        "values without a default",
        memory({"validValues": ["1Gi"]}),
        f"{POLICY}.default",
        "Required value: required when validValues is defined",
    ),
    (
        "a range without a default",
        memory({"validRange": {"min": "1Gi"}}),
        f"{POLICY}.default",
        "Required value: required when validRange is defined",
    ),
    (
        "a range without a min",
        memory({"default": "1Gi", "validRange": {"max": "2Gi"}}),
        f"{POLICY}.validRange.min",
        "Required value: required when validRange is defined",
    ),
    (
        "values not in order",
        memory({"default": "1Gi", "validValues": ["2Gi", "1Gi"]}),
        f"{POLICY}.validValues[1]",
        'Invalid value: "1Gi": values must be sorted in ascending order',
    ),
    (
        "a value above the capacity (both in canonical form)",
        memory({"default": "256Mi", "validValues": ["256Mi", "1024Mi"]}, "0.5Gi"),
        f"{POLICY}.validValues[1]",
        'Invalid value: "1Gi": option is larger than capacity value: 512Mi',
    ),
    (
        "a value twice",
        memory({"default": "1Gi", "validValues": ["1Gi", "1024Mi"]}),
        f"{POLICY}.validValues[1]",
        'Duplicate value: "1073741824"',
    ),
    (
        "two values of the same integer (DRAFractionalCapacityRange is off by default)",
        memory({"default": "2", "validValues": ["1.5", "2"]}, "4"),
        f"{POLICY}.validValues[1]",
        'Duplicate value: "2"',
    ),
    (
        "a default not among the values",
        memory({"default": "3Gi", "validValues": ["1Gi", "2Gi"]}),
        f"{POLICY}.validValues",
        'Invalid value: "3Gi": default value is not valid according to the requestPolicy',
    ),
    (
        "eleven values",
        memory({"default": "1", "validValues": [str(i) for i in range(1, 12)]}, "16"),
        f"{POLICY}.validValues",
        "Too many: 11: must have at most 10 items",
    ),
    (
        "eleven values: the default is not looked for",
        memory({"default": "1", "validValues": [str(i) for i in range(1, 12)]}, "16"),
        f"{POLICY}.validValues",
        'Invalid value: "1": default value is not valid according to the requestPolicy',
    ),
    (
        "a min above the capacity",
        memory({"default": "16Gi", "validRange": {"min": "16Gi"}}),
        f"{POLICY}.validRange.min",
        'Invalid value: "16Gi": min is larger than capacity value: 8Gi',
    ),
    (
        "a default below the min (its path is under validRange)",
        memory({"default": "1Gi", "validRange": {"min": "2Gi"}}),
        f"{POLICY}.validRange.default",
        'Invalid value: "1Gi": default is less than min: 2Gi',
    ),
    (
        "a min above the max (the min shown at max)",
        memory({"default": "4Gi", "validRange": {"min": "4Gi", "max": "2Gi"}}),
        f"{POLICY}.validRange.max",
        'Invalid value: "4Gi": min is larger than max: 2Gi',
    ),
    (
        "a max above the capacity",
        memory({"default": "1Gi", "validRange": {"min": "1Gi", "max": "9Gi"}}),
        f"{POLICY}.validRange.max",
        'Invalid value: "9Gi": max is larger than capacity value: 8Gi',
    ),
    (
        "a default above the max",
        memory({"default": "4Gi", "validRange": {"min": "1Gi", "max": "2Gi"}}),
        f"{POLICY}.validRange.default",
        'Invalid value: "4Gi": default is more than max: 2Gi',
    ),
    (
        "a step of zero",
        memory({"default": "1Gi", "validRange": {"min": "1Gi", "step": "0"}}),
        f"{POLICY}.validRange.step",
        'Invalid value: "0": must be greater than zero',
    ),
    (
        "one step past the capacity",
        memory({"default": "6Gi", "validRange": {"min": "6Gi", "step": "4Gi"}}),
        f"{POLICY}.validRange.step",
        'Invalid value: "4Gi": one step 10Gi is larger than capacity value: 8Gi',
    ),
    (
        "a default between steps",
        memory({"default": "2Gi", "validRange": {"min": "1Gi", "step": "2Gi"}}),
        f"{POLICY}.validRange.step",
        'Invalid value: "2Gi": value is not a multiple of a given step (2Gi) from (1Gi)',
    ),
    (
        "a max between steps",
        memory({"default": "1Gi", "validRange": {"min": "1Gi", "max": "4Gi", "step": "2Gi"}}),
        f"{POLICY}.validRange.step",
        'Invalid value: "4Gi": value is not a multiple of a given step (2Gi) from (1Gi)',
    ),
    (
        "a negative min with a step",
        memory({"default": "0", "validRange": {"min": "-1", "step": "1"}}),
        f"{POLICY}.validRange.min",
        'Invalid value: "-1": must be greater than or equal to 0',
    ),
    (
        "a long capacity name: cut in the middle in the path",
        with_devices(shared("gpu-0", **{"m" * 100: ("8Gi", {"default": "1Gi"})}, multiple=None)),
        f"spec.devices[0].capacity[{'m' * 47}...{'m' * 46}].requestPolicy",
        "Forbidden: allowMultipleAllocations must be true",
    ),
]


@pytest.mark.parametrize(("case", "change"), VALID, ids=[c for c, _ in VALID])
def test_valid_slices(case: str, change: Callable[[Body], None]) -> None:
    body = slice_body()
    change(body)
    assert [str(e) for e in validate_slice(body)] == [], case


@pytest.mark.parametrize(("case", "change", "path", "text"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_slices(case: str, change: Callable[[Body], None], path: str, text: str) -> None:
    body = slice_body()
    change(body)
    errors = validate_slice(body)
    assert any(e.field == path and text in e.body for e in errors), [str(e) for e in errors]


def test_an_unchanged_capacity_is_not_checked_again_on_update() -> None:
    # Upstream skips the capacities of a device that has the same ones as the stored device of
    # its name: a policy left on a device no longer shared passes, a changed one does not.
    old = slice_body(devices=[shared("gpu-0", memory=("8Gi", {"default": "1Gi"}))])
    new = copy.deepcopy(old)
    new["spec"]["devices"][0]["allowMultipleAllocations"] = False
    assert validate_slice(new, old) == []
    new["spec"]["devices"][0]["capacity"]["memory"]["value"] = "8192Mi"  # the same quantity
    assert validate_slice(new, old) == []
    new["spec"]["devices"][0]["capacity"]["memory"]["value"] = "16Gi"
    assert [str(e) for e in validate_slice(new, old)] == [
        f"{POLICY}: Forbidden: allowMultipleAllocations must be true"
    ]


def test_with_the_fractional_gate_ranges_are_checked_in_milli_units() -> None:
    body = slice_body()
    memory({"default": "1500m", "validRange": {"min": "0", "step": "500m"}}, "4")(body)
    assert validate_slice(body, fractional_capacity_range=True) == []
    # Without the gate the step reads as 1 (Value() rounds up) and 1500m as 2: on a step too.
    assert validate_slice(body) == []
    memory({"default": "1200m", "validRange": {"min": "0", "step": "500m"}}, "4")(body)
    assert [str(e) for e in validate_slice(body, fractional_capacity_range=True)] == [
        f'{POLICY}.validRange.step: Invalid value: "1200m": '
        "value is not a multiple of a given step (500m) from (0)"
    ]
    memory({"default": "1", "validRange": {"min": "0", "step": "1u"}}, "4")(body)
    assert [str(e) for e in validate_slice(body, fractional_capacity_range=True)] == [
        f'{POLICY}.validRange.step: Invalid value: "1u": value cannot be represented as a milli value'
    ]


@pytest.mark.parametrize(
    ("values", "duplicate"),
    [
        # What a 1.37.2 kube-apiserver with --feature-gates=DRAFractionalCapacityRange=true says:
        # the key is the decimal text of the value as parsed, trailing zeros and all.
        (["1Gi", "1024Mi"], "1073741824"),
        (["0.5", "0.5"], "0.5"),
        (["500m", "0.500"], "0.500"),
        (["500m", "0.5"], None),
        (["1.5Gi", "1536Mi"], None),
        (["1.5", "2"], None),
    ],
)
def test_with_the_fractional_gate_duplicates_are_decimal_texts(
    values: list[str], duplicate: str | None
) -> None:
    body = slice_body()
    memory({"default": values[0], "validValues": values}, "4Gi")(body)
    errors = [str(e) for e in validate_slice(body, fractional_capacity_range=True)]
    assert errors == (
        [] if duplicate is None else [f'{POLICY}.validValues[1]: Duplicate value: "{duplicate}"']
    )


async def _post_to_real(real: RealAPI, body: Body) -> httpx2.Response:
    async with Kube("real", real.url, real=real).raw() as http:
        await http.delete(SLICES)
        return await post_slice(http, body)


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "change"), VALID, ids=[c for c, _ in VALID])
async def test_the_real_api_server_accepts_the_valid_slices(
    real_api_server: RealAPI, case: str, change: Callable[[Body], None]
) -> None:
    body = slice_body()
    change(body)
    answer = await _post_to_real(real_api_server, body)
    assert answer.status_code == 201, (case, answer.json().get("message"))
    # The gate is on: nothing was dropped.
    assert answer.json()["spec"]["devices"][0].get("allowMultipleAllocations") == body["spec"]["devices"][
        0
    ].get("allowMultipleAllocations")


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "change", "path", "text"), INVALID, ids=[c[0] for c in INVALID])
async def test_the_real_api_server_refuses_the_invalid_slices(
    real_api_server: RealAPI, case: str, change: Callable[[Body], None], path: str, text: str
) -> None:
    body = slice_body()
    change(body)
    answer = await _post_to_real(real_api_server, body)
    assert answer.status_code == 422, (case, answer.status_code, answer.json().get("message"))
    causes = answer.json()["details"]["causes"]
    assert any(c.get("field") == path and text in c["message"] for c in causes), causes


@pytest.mark.anyio
async def test_an_unchanged_capacity_is_not_checked_again_on_either_server(kube: Kube) -> None:
    body = slice_body(devices=[shared("gpu-0", memory=("8Gi", {"default": "1Gi"}))])
    async with kube.raw() as http:
        created = await post_slice(http, body)
        assert created.status_code == 201, created.text
        stored = created.json()
        stored["spec"]["devices"][0]["allowMultipleAllocations"] = False
        url = f"{SLICES}/{stored['metadata']['name']}"
        headers = {"Content-Type": "application/json"}
        kept = await http.put(url, content=json.dumps(stored), headers=headers)
        assert kept.status_code == 200, kept.text
        changed = kept.json()
        changed["spec"]["devices"][0]["capacity"]["memory"]["value"] = "16Gi"
        refused = await http.put(url, content=json.dumps(changed), headers=headers)
    assert refused.status_code == 422, refused.text
    assert [(c["field"], c["message"]) for c in refused.json()["details"]["causes"]] == [
        (POLICY, "Forbidden: allowMultipleAllocations must be true")
    ]


# -- quantities as the API server writes them ----------------------------------------------------------

CANONICAL: list[tuple[Any, str]] = [
    ("1Gi", "1Gi"),
    ("1024Mi", "1Gi"),
    ("1.5Gi", "1536Mi"),
    ("0.5Ki", "512"),
    ("2048", "2048"),
    ("1000", "1k"),
    ("1500", "1500"),
    ("15000", "15k"),
    ("0.5", "500m"),
    ("1000m", "1"),
    ("1e3", "1e3"),
    ("10e3", "10e3"),
    ("1E", "1E"),
    ("0.1n", "1n"),
    ("0", "0"),
    (4, "4"),
]


@pytest.mark.parametrize(("given", "written"), CANONICAL)
def test_canonical_quantities(given: Any, written: str) -> None:
    assert str(Quantity.parse(given)) == written


@pytest.mark.anyio
async def test_the_real_api_server_writes_the_same_canonical_quantities(real_api_server: RealAPI) -> None:
    capacity = {f"c{i}": {"value": given} for i, (given, _) in enumerate(CANONICAL)}
    answer = await _post_to_real(real_api_server, slice_body(devices=[device("gpu-0", capacity=capacity)]))
    assert answer.status_code == 201, answer.text
    written = answer.json()["spec"]["devices"][0]["capacity"]
    assert {k: v["value"] for k, v in written.items()} == {f"c{i}": w for i, (_, w) in enumerate(CANONICAL)}


# -- decoding ------------------------------------------------------------------------------------------


def claim_body(name: str = "c", *, capacity: dict[str, Any] | None = None, mode: str = "ExactCount") -> Body:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = 1
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


@pytest.mark.anyio
async def test_amounts_that_are_not_quantities_cannot_be_decoded(kube: Kube) -> None:
    bad_policy = slice_body(devices=[shared("gpu-0", memory=("8Gi", {"default": "plenty"}))])
    async with kube.raw() as http:
        if kube.real is not None:
            await http.post("/api/v1/namespaces", json={"metadata": {"name": "ns"}})
        sliced = await post_slice(http, bad_policy)
        claimed = await http.post(CLAIMS, json=claim_body(capacity={"memory": "lots"}))
        fine = await http.post(CLAIMS, json=claim_body("fine", capacity={"memory": "4Gi"}))
        await http.delete(f"{CLAIMS}/fine")
    assert (sliced.status_code, claimed.status_code) == (400, 400)
    assert sliced.json()["message"] == (
        f'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: {QUANTITY_ERROR}'
    )
    assert claimed.json()["message"] == (
        f'ResourceClaim in version "v1" cannot be handled as a ResourceClaim: {QUANTITY_ERROR}'
    )
    assert fine.status_code == 201, fine.text
    assert fine.json()["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "4Gi"}
    }


# -- the DRAConsumableCapacity gate off -------------------------------------------------------------------


def test_without_the_gate_slices_lose_sharing_and_policies() -> None:
    body = slice_body(devices=[shared("gpu-0", memory=("8Gi", {"default": "1Gi"})), device("plain")])
    drop_disabled_fields(body, gates=Gates(consumable_capacity=False))
    assert body["spec"]["devices"] == [
        {"name": "gpu-0", "capacity": {"memory": {"value": "8Gi"}}},
        {"name": "plain"},
    ]
    # An update of a slice that uses them (allowMultipleAllocations even false) keeps them.
    old = slice_body(devices=[shared("gpu-0", multiple=False, memory="8Gi")])
    new = slice_body(devices=[shared("gpu-0", memory=("8Gi", {"default": "1Gi"}))])
    drop_disabled_fields(new, old, gates=Gates(consumable_capacity=False))
    assert new["spec"]["devices"][0]["allowMultipleAllocations"] is True
    assert new["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] == {"default": "1Gi"}
    kept = slice_body(devices=[shared("gpu-0", memory=("8Gi", {"default": "1Gi"}))])
    prepare_create(KINDS["resourceslices"], kept)  # the gate's default: on
    assert kept["spec"]["devices"][0]["allowMultipleAllocations"] is True


def test_without_the_gate_claims_lose_capacity_requests() -> None:
    body = claim_body(capacity={"memory": "4Gi"})
    body["spec"]["devices"]["requests"].append(
        {
            "name": "alt",
            "firstAvailable": [{"name": "a", "deviceClassName": DRIVER, "capacity": {"requests": {}}}],
        }
    )
    body["spec"]["devices"]["constraints"] = [{"requests": ["gpu"], "distinctAttribute": "example.com/id"}]
    prepare_create(KINDS["resourceclaims"], body, Gates(consumable_capacity=False))
    requests = body["spec"]["devices"]["requests"]
    assert "capacity" not in requests[0]["exactly"]
    assert "capacity" not in requests[1]["firstAvailable"][0]
    assert body["spec"]["devices"]["constraints"] == [{"requests": ["gpu"]}]
    kept = claim_body(capacity={"memory": "4Gi"})
    prepare_create(KINDS["resourceclaims"], kept)
    assert kept["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "4Gi"}}


def test_without_the_gate_status_writes_lose_share_ids() -> None:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    share = {**result, "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "1Gi"}}
    old = claim_body()
    old["metadata"].update(uid="u", resourceVersion="1")
    new = copy.deepcopy(old)
    new["status"] = {
        "allocation": {"devices": {"results": [share]}},
        "devices": [{"driver": DRIVER, "pool": NODE, "device": "gpu-0", "shareID": share["shareID"]}],
    }
    written = prepare_update(KINDS["resourceclaims"], new, old, "status", Gates(consumable_capacity=False))
    assert written["status"]["allocation"]["devices"]["results"] == [result]
    assert written["status"]["devices"] == [{"driver": DRIVER, "pool": NODE, "device": "gpu-0"}]
    # A claim that uses the gate's fields (here its spec asks capacity) keeps them.
    asking = claim_body(capacity={"memory": "1Gi"})
    again = copy.deepcopy(asking)
    again["status"] = copy.deepcopy(new["status"])
    drop_disabled_claim_status_fields(again, asking, gates=Gates(consumable_capacity=False))
    assert again["status"]["allocation"]["devices"]["results"] == [share]


# -- allocation ------------------------------------------------------------------------------------------


async def publish(client: lightkube.AsyncClient, *devices: Body, name: str = "s1", **spec: Any) -> None:
    await client.create(ResourceSlice.from_dict(slice_body(name, devices=list(devices), **spec)))


def results_of(claim: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results


def allocate(api: FakeKubeAPI, name: str, **kwargs: Any) -> list[dict[str, Any]]:
    return results_of(api.allocate_claim("ns", name, node=NODE, driver=DRIVER, **kwargs))


def shares(results: list[dict[str, Any]]) -> list[tuple[str, dict[str, str] | None]]:
    """(device, consumedCapacity) of each result, checking that each share has a UUID shareID."""
    for r in results:
        if "shareID" in r:
            assert str(uuid.UUID(r["shareID"])) == r["shareID"]
    return [(r["device"], r.get("consumedCapacity")) for r in results]


@pytest.mark.anyio
async def test_two_claims_share_one_device(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await publish(client, shared("gpu-0", memory="8Gi", cores="4"))
    api.add_claim("ns", "a", capacity={"gpu": {"memory": "3Gi", "cores": "1"}})
    api.add_claim("ns", "b", capacity={"gpu": {"memory": "5Gi", "cores": "3"}})
    first, second = allocate(api, "a"), allocate(api, "b")
    assert shares(first) == [("gpu-0", {"cores": "1", "memory": "3Gi"})]
    assert shares(second) == [("gpu-0", {"cores": "3", "memory": "5Gi"})]
    assert first[0]["shareID"] != second[0]["shareID"]
    assert list(first[0]) == ["request", "driver", "pool", "device", "shareID", "consumedCapacity"]
    read = await client.get(ResourceClaim, "b", namespace="ns")  # what a driver reads
    assert read.status.allocation.devices.results[0].shareID == second[0]["shareID"]


@pytest.mark.anyio
async def test_shares_are_summed_over_claims_until_the_capacity_is_exhausted(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, shared("gpu-0", memory="8Gi"))
    for name, amount in (("a", "3Gi"), ("b", "3Gi"), ("c", "3Gi"), ("d", "2Gi")):
        api.add_claim("ns", name, capacity={"gpu": {"memory": amount}})
    assert shares(allocate(api, "a")) == [("gpu-0", {"memory": "3Gi"})]
    assert shares(allocate(api, "b")) == [("gpu-0", {"memory": "3Gi"})]
    with pytest.raises(AllocationError) as error:
        allocate(api, "c")
    assert str(error.value).endswith(
        "request gpu needs 1 device(s), 0 usable: "
        "device gpu-0: capacity memory exhausted: 3Gi asked, 2Gi of 8Gi left"
    )
    assert shares(allocate(api, "d")) == [("gpu-0", {"memory": "2Gi"})]  # exactly what is left


@pytest.mark.anyio
async def test_a_deleted_or_deallocated_claim_frees_its_share(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, shared("gpu-0", memory="8Gi"))
    for name in ("a", "b", "c"):
        api.add_claim("ns", name, capacity={"gpu": {"memory": "6Gi"}})
    allocate(api, "a")
    with pytest.raises(AllocationError, match="capacity memory exhausted"):
        allocate(api, "b")
    api.delete_claim("ns", "a")
    assert shares(allocate(api, "b")) == [("gpu-0", {"memory": "6Gi"})]
    with pytest.raises(AllocationError, match="capacity memory exhausted"):
        allocate(api, "c")
    # Deallocated through the API (status without allocation, as the scheduler writes it back).
    claim = (await client.get(ResourceClaim, "b", namespace="ns")).to_dict()
    await client.replace(ResourceClaimStatus.from_dict({**claim, "status": {}}), namespace="ns")
    assert shares(allocate(api, "c")) == [("gpu-0", {"memory": "6Gi"})]


@pytest.mark.anyio
async def test_what_a_request_without_amounts_consumes(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    # The policy's default, or else the whole capacity (in the canonical form of the value).
    await publish(client, shared("gpu-0", memory=("8192Mi", {"default": "1Gi"}), cores="4"))
    api.add_claim("ns", "a")
    api.add_claim("ns", "b")
    assert shares(allocate(api, "a")) == [("gpu-0", {"cores": "4", "memory": "1Gi"})]
    with pytest.raises(AllocationError, match="device gpu-0: capacity cores exhausted: 4 asked, 0 of 4 left"):
        allocate(api, "b")


@pytest.mark.anyio
async def test_amounts_are_rounded_up_to_the_valid_values(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    policy = {"default": "2Gi", "validValues": ["2Gi", "4Gi", "8Gi"]}
    await publish(client, shared("gpu-0", memory=("16Gi", policy)))
    for name, amount in (("small", "1"), ("odd", "3Gi"), ("exact", "8Gi"), ("huge", "9Gi")):
        api.add_claim("ns", name, capacity={"gpu": {"memory": amount}})
    assert shares(allocate(api, "small")) == [("gpu-0", {"memory": "2Gi"})]
    assert shares(allocate(api, "odd")) == [("gpu-0", {"memory": "4Gi"})]
    assert shares(allocate(api, "exact")) == [("gpu-0", {"memory": "8Gi"})]  # 14Gi of 16Gi now
    with pytest.raises(
        AllocationError, match="device gpu-0: capacity memory: 9Gi is not allowed by its requestPolicy"
    ):
        allocate(api, "huge")


@pytest.mark.anyio
async def test_amounts_are_rounded_up_to_the_range_and_its_step(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "6Gi", "step": "512Mi"}}
    await publish(client, shared("gpu-0", memory=("16Gi", policy)))
    for name, amount in (("tiny", "1Mi"), ("between", "1100Mi"), ("on", "1.5Gi"), ("over", "6.5Gi")):
        api.add_claim("ns", name, capacity={"gpu": {"memory": amount}})
    assert shares(allocate(api, "tiny")) == [("gpu-0", {"memory": "1Gi"})]  # up to min
    assert shares(allocate(api, "between")) == [("gpu-0", {"memory": "1536Mi"})]  # the step's form
    assert shares(allocate(api, "on")) == [("gpu-0", {"memory": "1536Mi"})]
    with pytest.raises(AllocationError, match="capacity memory: 6656Mi is not allowed by its requestPolicy"):
        allocate(api, "over")  # past max


@pytest.mark.anyio
async def test_the_fractional_gate_rounds_in_milli_units(
    api: FakeKubeAPI, client: lightkube.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = {"default": "1", "validRange": {"min": "0", "step": "500m"}}
    await publish(client, shared("gpu-0", cores=("4", policy)))
    for name in ("off", "on"):
        api.add_claim("ns", name, capacity={"gpu": {"cores": "300m"}})
    # Off (a default 1.37 scheduler): Value() integers, 300m reads 1 and the step 1.
    assert shares(allocate(api, "off")) == [("gpu-0", {"cores": "1"})]
    monkeypatch.setattr(_kubeapi_scheduler, "FRACTIONAL_CAPACITY_RANGE", True)
    assert shares(allocate(api, "on")) == [("gpu-0", {"cores": "500m"})]


@pytest.mark.anyio
async def test_a_device_without_the_capacity_asked_is_not_picked(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(
        client,
        shared("plain"),
        shared("small", multiple=None, memory="4Gi"),
        shared("big", multiple=None, memory="16Gi"),
    )
    api.add_claim("ns", "c", requests=[("gpu", 2)], capacity={"gpu": {"memory": "8Gi"}})
    with pytest.raises(AllocationError) as error:
        allocate(api, "c")
    assert str(error.value).endswith(
        "request gpu needs 2 device(s), 1 usable: device plain has no capacity memory; "
        "device small: capacity memory is 4Gi, less than the 8Gi asked"
    )
    # A device not shared is taken whole: no shareID, no consumedCapacity.
    assert allocate(api, "c", count=1) == [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "big"}
    ]


@pytest.mark.anyio
async def test_whole_and_shared_allocations_exclude_each_other(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    # A device held whole is not shared after its slice allows sharing ...
    await publish(client, shared("gpu-0", multiple=None, memory="8Gi"))
    api.add_claim("ns", "whole")
    api.add_claim("ns", "share", capacity={"gpu": {"memory": "1Gi"}})
    assert shares(allocate(api, "whole")) == [("gpu-0", None)]
    stored = (await client.get(ResourceSlice, "s1")).to_dict()
    stored["spec"]["devices"] = [shared("gpu-0", memory="8Gi")]
    await client.replace(ResourceSlice.from_dict(stored))
    with pytest.raises(AllocationError, match="device gpu-0 is allocated to claim ns/whole"):
        allocate(api, "share")
    # ... and a shared one is not taken whole once its slice stops sharing it.
    api.delete_claim("ns", "whole")
    assert shares(allocate(api, "share")) == [("gpu-0", {"memory": "1Gi"})]
    stored = (await client.get(ResourceSlice, "s1")).to_dict()
    stored["spec"]["devices"] = [shared("gpu-0", multiple=None, memory="8Gi")]
    await client.replace(ResourceSlice.from_dict(stored))
    api.add_claim("ns", "again")
    with pytest.raises(
        AllocationError, match="device gpu-0: capacity memory exhausted: 8Gi asked, 7Gi of 8Gi left"
    ):
        allocate(api, "again")


@pytest.mark.anyio
async def test_requests_of_one_claim_share_a_device_but_never_twice_in_one_request(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, shared("gpu-0", memory="8Gi"))
    api.add_claim(
        "ns", "two", requests=[("a", 1), ("b", 1)], capacity={"a": {"memory": "2Gi"}, "b": {"memory": "6Gi"}}
    )
    results = allocate(api, "two")
    assert [(r["request"], r["device"], r["consumedCapacity"]) for r in results] == [
        ("a", "gpu-0", {"memory": "2Gi"}),
        ("b", "gpu-0", {"memory": "6Gi"}),
    ]
    assert len({r["shareID"] for r in results}) == 2
    api.add_claim("ns", "double", requests=[("gpu", 2)], capacity={"gpu": {"memory": "0"}})
    with pytest.raises(AllocationError, match=r"request gpu needs 2 device\(s\), 1 usable: no more devices"):
        allocate(api, "double")
    with pytest.raises(ValueError, match="capacity for requests that the claim does not have: c"):
        api.add_claim("ns", "typo", requests=[("a", 1)], capacity={"c": {"memory": "1Gi"}})
    with pytest.raises(APIError) as refused:
        api.add_claim("ns", "vague", capacity={"gpu": {"memory": "lots"}})
    assert refused.value.code == 400
    assert refused.value.message.endswith(QUANTITY_ERROR)


@pytest.mark.anyio
async def test_a_shared_device_consumes_its_counters_once(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    counters = [{"name": "card", "counters": {"memory": {"value": "8Gi"}}}]
    consumes = [{"counterSet": "card", "counters": {"memory": {"value": "8Gi"}}}]
    await client.create(
        ResourceSlice.from_dict(slice_body("s0", count=2, devices=[], sharedCounters=counters))
    )
    card = {**shared("whole", memory="8Gi"), "consumesCounters": consumes}
    half = device("half", consumesCounters=[{"counterSet": "card", "counters": {"memory": {"value": "4Gi"}}}])
    await publish(client, card, half, name="s1", count=2)
    for name in ("a", "b"):
        api.add_claim("ns", name, capacity={"gpu": {"memory": "4Gi"}})
    api.add_claim("ns", "c")
    api.add_claim(
        "ns", "both", requests=[("x", 1), ("y", 1)], capacity={"x": {"memory": "1Gi"}, "y": {"memory": "1Gi"}}
    )
    assert shares(allocate(api, "both")) == [("whole", {"memory": "1Gi"}), ("whole", {"memory": "1Gi"})]
    api.delete_claim("ns", "both")
    assert shares(allocate(api, "a")) == [("whole", {"memory": "4Gi"})]
    assert shares(allocate(api, "b")) == [("whole", {"memory": "4Gi"})]  # its counters are counted already
    with pytest.raises(AllocationError, match="device half: counter set card: memory exhausted"):
        allocate(api, "c")


@pytest.mark.anyio
async def test_where_first_fit_blocks_itself_the_search_moves_the_shares(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(client, shared("big", memory="8Gi"), shared("small", memory="4Gi"))
    api.add_claim(
        "ns", "c", requests=[("a", 1), ("b", 1)], capacity={"a": {"memory": "4Gi"}, "b": {"memory": "8Gi"}}
    )
    results = allocate(api, "c")  # first fit gives "a" big, and "b" finds nothing
    assert [(r["request"], r["device"]) for r in results] == [("a", "small"), ("b", "big")]


@pytest.mark.anyio
async def test_all_devices_means_those_that_could_hold_the_request(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await publish(
        client,
        shared("x", memory="8Gi"),
        shared("y", memory="8Gi"),
        shared("tiny", memory="1Gi"),
        device("none"),
    )
    await client.create(ResourceClaim.from_dict(claim_body("every", capacity={"memory": "4Gi"}, mode="All")))
    api.add_claim("ns", "hog", requests=[("gpu", ["y"])], capacity={"gpu": {"memory": "6Gi"}})
    assert shares(allocate(api, "every")) == [("x", {"memory": "4Gi"}), ("y", {"memory": "4Gi"})]
    api.delete_claim("ns", "every")
    await client.create(ResourceClaim.from_dict(claim_body("every", capacity={"memory": "4Gi"}, mode="All")))
    allocate(api, "hog")
    with pytest.raises(
        AllocationError, match="needs all devices, 1 usable: device y: capacity memory exhausted"
    ):
        allocate(api, "every")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("capacity", "asked", "why"),
    [
        ("8Gi", "-1Gi", 'capacity "memory": capacity value is negative'),
        (
            ("8Gi", {"default": "1Gi", "validRange": {"min": "0", "step": "1Gi"}}),
            "10E",
            "capacity request cannot be represented in the device's range arithmetic: "
            "request 10E exceeds MaxInt64",
        ),
    ],
)
async def test_an_amount_the_allocator_cannot_hold_ends_the_allocation(
    api: FakeKubeAPI, client: lightkube.AsyncClient, capacity: Any, asked: str, why: str
) -> None:
    # Not a device that does not fit: an error of the allocator, no other device is tried.
    await publish(client, shared("gpu-0", memory=capacity), shared("gpu-1", memory="8Gi"))
    api.add_claim("ns", "c", capacity={"gpu": {"memory": asked}})
    with pytest.raises(AllocationError) as error:
        allocate(api, "c")
    assert f"request gpu: checking capacity for device {DRIVER}/{NODE}/gpu-0: " in str(error.value)
    assert str(error.value).endswith(why)
