"""The allocation parser: a ResourceClaim's ``status.allocation.devices`` as typed records, read
once; malformed data an error naming the field, never another exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplug._dra.allocation import (
    Allocation,
    AllocationError,
    DeviceConfig,
    DeviceResult,
    PreparedEntry,
    parse_allocation,
)
from tests.dra.claims_kit import DRIVER, NODE, World, claim

pytestmark = pytest.mark.anyio

RESULT = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "w0"}


def allocated(results: Any = None, config: Any = None) -> dict[str, Any]:
    devices: dict[str, Any] = {}
    if results is not None:
        devices["results"] = results
    if config is not None:
        devices["config"] = config
    return {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": devices}}}


@pytest.mark.parametrize(
    ("result", "parsed"),
    [
        (RESULT, DeviceResult(request="gpu", driver=DRIVER, pool=NODE, device="w0")),
        (
            {**RESULT, "request": "gpu/small", "adminAccess": True, "shareID": "s-1"},
            DeviceResult("gpu/small", DRIVER, NODE, "w0", admin_access=True, share_id="s-1"),
        ),
        (
            {**RESULT, "adminAccess": None, "shareID": "", "tolerations": None},
            DeviceResult("gpu", DRIVER, NODE, "w0"),
        ),
        (
            {
                **RESULT,
                "consumedCapacity": {"memory": "4Gi"},
                "tolerations": [{"key": "hot", "operator": "Exists"}],
                "bindingConditions": ["Ready"],
                "bindingFailureConditions": ["Failed"],
                "somethingNew": {"ignored": True},  # a field of a later API version
            },
            DeviceResult(
                "gpu",
                DRIVER,
                NODE,
                "w0",
                consumed_capacity={"memory": "4Gi"},
                tolerations=({"key": "hot", "operator": "Exists"},),
                binding_conditions=("Ready",),
                binding_failure_conditions=("Failed",),
            ),
        ),
    ],
)
def test_results(result: dict[str, Any], parsed: DeviceResult) -> None:
    assert parse_allocation(allocated([result])) == Allocation(results=(parsed,))


@pytest.mark.parametrize(
    ("config", "parsed"),
    [
        (
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"n": 1}}},
            DeviceConfig("FromClass", driver=DRIVER, parameters={"n": 1}),
        ),
        (
            {"source": "FromClaim", "requests": ["a", "b"], "opaque": {"driver": DRIVER}},
            DeviceConfig("FromClaim", requests=("a", "b"), driver=DRIVER),
        ),
        (
            {"requests": None, "opaque": {"driver": "x.example.com"}},
            DeviceConfig("FromClaim", driver="x.example.com"),
        ),
        ({"source": "FromClass"}, DeviceConfig("FromClass")),  # not an opaque config: no driver's
    ],
)
def test_configs(config: dict[str, Any], parsed: DeviceConfig) -> None:
    assert parse_allocation(allocated(config=[config])) == Allocation(configs=(parsed,))


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"uid": "u1"}},
        {"metadata": {"uid": "u1"}, "status": None},
        {"metadata": {"uid": "u1"}, "status": {}},
        {"metadata": {"uid": "u1"}, "status": {"allocation": None}},
        {"metadata": {"uid": "u1"}, "status": {"allocation": {}}},
    ],
)
def test_a_claim_without_allocation_is_none(obj: dict[str, Any]) -> None:
    assert parse_allocation(obj) is None


@pytest.mark.parametrize(
    "obj",
    [
        {"status": {"allocation": {"nodeSelector": {}}}},
        {"status": {"allocation": {"devices": None}}},
        allocated(),
        allocated(results=None, config=None),
        allocated(results=[], config=[]),
    ],
)
def test_an_allocation_without_devices_is_empty(obj: dict[str, Any]) -> None:
    assert parse_allocation(obj) == Allocation()


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "the claim is not an object: []"),
        ({"status": "done"}, "the claim.status is not an object: 'done'"),
        ({"status": {"allocation": ["x"]}}, "status.allocation is not an object: ['x']"),
        ({"status": {"allocation": {"devices": 1}}}, "status.allocation.devices is not an object: 1"),
        (allocated(results={"a": 1}), "status.allocation.devices.results is not a list: {'a': 1}"),
        (allocated(config="x"), "status.allocation.devices.config is not a list: 'x'"),
        (allocated(["w0"]), "status.allocation.devices.results[0] is not an object: 'w0'"),
        (allocated([{**RESULT, "device": 3}]), "results[0].device is not a string: 3"),
        (allocated([RESULT, {**RESULT, "device": ""}]), "results[1] has no device"),
        (allocated([{k: v for k, v in RESULT.items() if k != "pool"}]), "results[0] has no pool"),
        (allocated([{k: v for k, v in RESULT.items() if k != "request"}]), "results[0] has no request"),
        (allocated([{**RESULT, "driver": None}]), "results[0] has no driver"),
        (allocated([{**RESULT, "adminAccess": "yes"}]), "results[0].adminAccess is not true or false: 'yes'"),
        (allocated([{**RESULT, "shareID": 7}]), "results[0].shareID is not a string: 7"),
        (
            allocated([{**RESULT, "consumedCapacity": {"memory": 4}}]),
            "consumedCapacity.memory is not a quantity",
        ),
        (allocated([{**RESULT, "consumedCapacity": []}]), "results[0].consumedCapacity is not an object"),
        (allocated([{**RESULT, "tolerations": ["hot"]}]), "results[0].tolerations[0] is not an object"),
        (
            allocated([{**RESULT, "bindingConditions": [1]}]),
            "results[0].bindingConditions[0] is not a string",
        ),
        (allocated(config=[None]), "config[0] is not an object: None"),
        (
            allocated(config=[{"source": "FromPod"}]),
            "config[0].source is 'FromPod', not FromClass or FromClaim",
        ),
        (allocated(config=[{"requests": "a"}]), "config[0].requests is not a list: 'a'"),
        (allocated(config=[{"opaque": []}]), "config[0].opaque is not an object: []"),
        (allocated(config=[{"opaque": {"parameters": {}}}]), "config[0].opaque has no driver"),
        (
            allocated(config=[{"opaque": {"driver": DRIVER, "parameters": [1]}}]),
            "opaque.parameters is not an object",
        ),
    ],
)
def test_malformed_data_names_the_field(obj: Any, message: str) -> None:
    with pytest.raises(AllocationError) as caught:
        parse_allocation(obj)
    assert message in str(caught.value)


def test_records_do_not_share_the_claim_s_objects() -> None:
    """The claim's dict goes to hooks as it came: what they do to it never reaches the records."""
    obj = allocated(
        [{**RESULT, "consumedCapacity": {"memory": "4Gi"}}],
        [{"opaque": {"driver": DRIVER, "parameters": {"n": 1}}}],
    )
    parsed = parse_allocation(obj)
    assert parsed is not None
    obj["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = "8Gi"
    obj["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["n"] = 2
    assert parsed.results[0].consumed_capacity == {"memory": "4Gi"}
    assert parsed.configs[0].parameters == {"n": 1}


def test_a_driver_s_results_and_configs() -> None:
    other = "x.example.com"
    parsed = parse_allocation(
        allocated(
            [RESULT, {**RESULT, "driver": other, "device": "x0"}, {**RESULT, "device": "w1"}],
            [
                {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"n": 2}}},
                {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"n": 1}}},
                {"source": "FromClass", "opaque": {"driver": other}},
                {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"n": 3}}},
            ],
        )
    )
    assert parsed is not None
    assert [r.device for r in parsed.results_of(DRIVER)] == ["w0", "w1"]
    assert [c.parameters["n"] for c in parsed.configs_of(DRIVER)] == [1, 2, 3]  # class configs first
    assert [c.driver for c in parsed.configs_of(other)] == [other]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_RESULT_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        k: _JSON | st.just(v)
        for k, v in {**RESULT, "adminAccess": True, "shareID": "s", "consumedCapacity": {"m": "1"}}.items()
    },
)


@settings(max_examples=200, deadline=None)
@given(results=st.lists(_RESULT_FIELDS | _JSON, max_size=3), config=_JSON)
def test_any_allocation_parses_or_names_its_fault(results: Any, config: Any) -> None:
    try:
        parse_allocation(allocated(results, config))
    except AllocationError as exc:
        message = str(exc)
    else:
        return
    assert message.startswith("status.allocation.devices")


# -- a prepared device, in memory and in the checkpoint -------------------------------------------


_TEXT = st.text(min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(
    st.builds(
        PreparedEntry,
        device=_TEXT,
        pool=_TEXT,
        requests=st.tuples(_TEXT),
        cdi_device_ids=st.lists(_TEXT, max_size=2).map(tuple),
        admin_access=st.booleans(),
        share_id=st.none() | _TEXT,
    )
)
def test_a_prepared_entry_survives_the_checkpoint_s_form(entry: PreparedEntry) -> None:
    data = entry.to_json()
    assert PreparedEntry.from_json(data) == entry
    assert ("shareID" in data) == (entry.share_id is not None)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("w0", "device is not an object"),
        ({"pool": NODE}, "device has no device"),
        ({"device": "w0", "pool": NODE, "requests": "a"}, "device.requests is not a list"),
        ({"device": "w0", "pool": NODE, "cdiDeviceIds": [None]}, "device.cdiDeviceIds[0] is not a string"),
        ({"device": "w0", "pool": NODE, "adminAccess": 1}, "device.adminAccess is not true or false"),
    ],
)
def test_a_malformed_prepared_entry_names_the_field(data: Any, message: str) -> None:
    with pytest.raises(AllocationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PreparedEntry.from_json(data)


# -- through the preparer: the claim's own error, the others prepared ------------------------------


async def test_a_malformed_allocation_is_that_claim_s_error(tmp_path: Path) -> None:
    w = World(tmp_path)
    good = w.add(claim("ok", [("a", "w0")]))
    bad = claim("u2", [("a", "w1")])
    bad["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = "yes"
    broken = w.add(bad)
    odd = w.add({"metadata": {"uid": "u3", "namespace": "ns", "name": "c-u3"}, "status": {"allocation": 5}})
    result = await w.preparer.prepare([good, broken, odd])
    assert {uid: o.error for uid, o in result.items()} == {
        "ok": "",
        "u2": "claim ns/c-u2: malformed allocation: "
        "status.allocation.devices.results[0].adminAccess is not true or false: 'yes'",
        "u3": "claim ns/c-u3: malformed allocation: status.allocation is not an object: 5",
    }
    assert [d.device for d in result["ok"].devices] == ["w0"]
    assert set(w.checkpoint.claims) == {"ok"}
    assert w.plugin.allocations == [["w0"]]  # nothing was allocated for the malformed claims
