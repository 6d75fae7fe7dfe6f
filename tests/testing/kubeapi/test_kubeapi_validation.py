"""The API server's ResourceSlice rules in FakeKubeAPI: a table of valid and invalid slices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from devplug.testing._kubeapi.strategy import drop_disabled_fields
from devplug.testing._kubeapi.validation import validate_slice
from tests.testing.kubeapi.real_api import Kube, RealAPI
from tests.testing.kubeapi.test_kubeapi_kit import (
    NODE,
    SLICES,
    Body,
    device,
    pool,
    post_slice,
    slice_body,
    taint,
    with_devices,
)


def spec(**fields: Any) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["spec"].update(fields)

    return change


def meta(**fields: Any) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["metadata"].update(fields)

    return change


def counters_only(**fields: Any) -> Callable[[Body], None]:
    """A slice of counter sets: no `devices` at all (an empty list counts as set: see below)."""

    def change(body: Body) -> None:
        del body["spec"]["devices"]
        body["spec"].update(fields)

    return change


def no_node(body: Body) -> None:
    del body["spec"]["nodeName"]


def attrs(n: int, caps: int = 0) -> Body:
    return device(
        "gpu-0",
        attributes={f"a{i}": {"int": i} for i in range(n)},
        capacity={f"c{i}": {"value": "1"} for i in range(caps)},
    )


OWNER = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1", "controller": True}
LABEL_MSG = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"
SUBDOMAIN_MSG = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"

VALID: list[tuple[str, Callable[[Body], None]]] = [
    ("minimal", lambda b: None),
    ("all nodes", lambda b: (no_node(b), spec(allNodes=True)(b))),
    (
        "node selector",
        lambda b: (
            no_node(b),
            spec(
                nodeSelector={
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            )(b),
        ),
    ),
    (
        "per-device node selection",
        lambda b: (no_node(b), spec(perDeviceNodeSelection=True, devices=[device("d", nodeName=NODE)])(b)),
    ),
    ("pool name of subdomains", pool(name="example.com/rack-1/node-1")),
    ("128 devices", with_devices(*(device(f"d{i}") for i in range(128)))),
    ("64 devices, tainted", with_devices(*(device(f"d{i}", taints=[taint()]) for i in range(64)))),
    ("32 attributes and capacities", with_devices(attrs(20, 12))),
    (
        "domain-qualified attribute",
        with_devices(device("d", attributes={"gpu.example.com/model": {"string": "a100"}})),
    ),
    (
        "semver with pre-release and build",
        with_devices(device("d", attributes={"v": {"version": "1.2.3-rc.1+b.5"}})),
    ),
    ("64-character string", with_devices(device("d", attributes={"s": {"string": "x" * 64}}))),
    ("taint effect None", with_devices(device("d", taints=[taint(effect="None", value="v1")]))),
    ("16 taints", with_devices(device("d", taints=[taint(f"k{i}") for i in range(16)]))),
    ("quantities", with_devices(device("d", capacity={"memory": {"value": "80Gi"}, "cores": {"value": 4}}))),
    ("owner reference", meta(ownerReferences=[OWNER], labels={"app.kubernetes.io/name": "driver"})),
    (
        "shared counters only",
        counters_only(sharedCounters=[{"name": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}]),
    ),
    (
        "two slashes in an attribute name (accepted: upstream's validation has a TODO)",
        with_devices(device("d", attributes={"a/b/c": {"int": 1}})),
    ),
    (
        "counter names are DNS labels",
        counters_only(
            sharedCounters=[{"name": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}],
        ),
    ),
    ("generation zero, many slices", pool(generation=0, resourceSliceCount=3)),
]

INVALID: list[tuple[str, Callable[[Body], None], str, str]] = [
    ("no driver", spec(driver=""), "spec.driver", "Required value"),
    ("long driver", spec(driver="d" * 60 + ".com"), "spec.driver", "Too long: may not be more than 63 bytes"),
    (
        "driver not a subdomain",
        spec(driver="bad_driver"),
        "spec.driver",
        f'Invalid value: "bad_driver": {SUBDOMAIN_MSG}',
    ),
    ("no pool name", pool(name=""), "spec.pool.name", "Required value"),
    ("empty pool name part", pool(name="a//b"), "spec.pool.name", f'Invalid value: "": {SUBDOMAIN_MSG}'),
    ("long pool name", pool(name="a." * 127), "spec.pool.name", "Too long: may not be more than 253 bytes"),
    (
        "negative generation",
        pool(generation=-1),
        "spec.pool.generation",
        "Invalid value: -1: must be greater than or equal to zero",
    ),
    (
        "no slice count",
        pool(resourceSliceCount=0),
        "spec.pool.resourceSliceCount",
        "Invalid value: 0: must be greater than zero",
    ),
    (
        "no node selection",
        no_node,
        "spec",
        "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`",
    ),
    (
        "two node selections",
        spec(allNodes=True),
        "spec",
        'Invalid value: "{`nodeName`, `allNodes`}": exactly one of',
    ),
    (
        "two selector terms",
        lambda b: (no_node(b), spec(nodeSelector={"nodeSelectorTerms": [{}, {}]})(b)),
        "spec.nodeSelector.nodeSelectorTerms",
        "must have exactly one node selector term",
    ),
    (
        "device name",
        with_devices(device("A_b")),
        "spec.devices[0].name",
        f'Invalid value: "A_b": {LABEL_MSG}',
    ),
    ("device name with a dot", with_devices(device("a.b")), "spec.devices[0].name", "must not contain dots"),
    (
        "duplicate devices",
        with_devices(device("gpu-0"), device("gpu-0")),
        "spec.devices[1]",
        'Duplicate value: "gpu-0"',
    ),
    (
        "129 devices",
        with_devices(*(device(f"d{i}") for i in range(129))),
        "spec.devices",
        "Too many: 129: must have at most 128 items",
    ),
    (
        "65 devices, one tainted",
        with_devices(device("t", taints=[taint()]), *(device(f"d{i}") for i in range(64))),
        "spec.devices",
        "Too many: 65: must have at most 64 items",
    ),
    (
        "65 devices, one consuming counters",
        with_devices(
            device("t", consumesCounters=[{"counterSet": "s", "counters": {"m": {"value": "1"}}}]),
            *(device(f"d{i}") for i in range(64)),
        ),
        "spec.devices",
        "Too many: 65: must have at most 64 items",
    ),
    (
        "33 attributes and capacities",
        with_devices(attrs(30, 3)),
        "spec.devices[0]",
        "Invalid value: 33: the total number of attributes and capacities must not exceed 32",
    ),
    (
        "attribute not a C identifier",
        with_devices(device("d", attributes={"1bad": {"int": 1}})),
        "spec.devices[0].attributes",  # a key's error is the map's
        'Invalid value: "1bad": a valid C identifier must start',
    ),
    (
        "long attribute name",
        with_devices(device("d", attributes={"a" * 33: {"int": 1}})),
        "spec.devices[0].attributes",
        "Too long: may not be more than 32 bytes",
    ),
    (
        "devices as an empty list beside counter sets",
        spec(devices=[], sharedCounters=[{"name": "s", "counters": {"m": {"value": "1"}}}]),
        "spec",
        'Invalid value: "": only one of `sharedCounters` or `devices` is allowed',
    ),
    (
        "bad attribute domain",
        with_devices(device("d", attributes={"Bad_Domain/x": {"int": 1}})),
        "spec.devices[0].attributes",
        SUBDOMAIN_MSG,
    ),
    (
        "attribute without a value",
        with_devices(device("d", attributes={"model": {}})),
        "spec.devices[0].attributes[model]",
        'Invalid value: "": must specify one of: `int`, `bool`, `string`, `version`, `ints`, `bools`',
    ),
    (
        "attribute with two values",
        with_devices(device("d", attributes={"model": {"int": 1, "string": "x"}})),
        "spec.devices[0].attributes[model]",
        'Invalid value: "{int, string}": must specify exactly one of: `int`, `bool`, `string`, `version`',
    ),
    (
        "65-character string",
        with_devices(device("d", attributes={"s": {"string": "x" * 65}})),
        "spec.devices[0].attributes[s].string",
        "Too long: may not be more than 64 bytes",
    ),
    (
        "not semver",
        with_devices(device("d", attributes={"v": {"version": "1.2"}})),
        "spec.devices[0].attributes[v].version",
        'Invalid value: "1.2": must be a string compatible with semver.org spec 2.0.0',
    ),
    (
        "list attributes are an alpha feature",
        with_devices(device("d", attributes={"l": {"ints": [1]}})),
        "spec.devices[0].attributes[l]",
        'Invalid value: "": must specify one of:',
    ),
    (
        "taint effect",
        with_devices(device("d", taints=[taint(effect="Sometimes")])),
        "spec.devices[0].taints[0].effect",
        'Unsupported value: "Sometimes": supported values: "NoExecute", "NoSchedule", "None"',
    ),
    (
        "taint without effect",
        with_devices(device("d", taints=[taint(effect=None)])),
        "spec.devices[0].taints[0].effect",
        "Required value",
    ),
    (
        "taint key",
        with_devices(device("d", taints=[taint(key="bad key")])),
        "spec.devices[0].taints[0].key",
        'Invalid value: "bad key": name part must consist of',
    ),
    (
        "17 taints",
        with_devices(device("d", taints=[taint(f"k{i}") for i in range(17)])),
        "spec.devices[0].taints",
        "Too many: 17: must have at most 16 items",
    ),
    (
        "per-device node field",
        with_devices(device("d", nodeName=NODE)),
        "spec.devices[0]",
        "can only be set if `perDeviceNodeSelection` is set",
    ),
    ("object name", meta(name="Bad"), "metadata.name", f'Invalid value: "Bad": {SUBDOMAIN_MSG}'),
    (
        "owner without uid",
        meta(ownerReferences=[{**OWNER, "uid": ""}]),
        "metadata.ownerReferences[0].uid",
        "Required value: must not be empty",
    ),
    (
        "two controllers",
        meta(ownerReferences=[OWNER, {**OWNER, "name": "n2", "uid": "u-2"}]),
        "metadata.ownerReferences",
        "Only one reference can have Controller set to true",
    ),
    ("label key", meta(labels={"a/b/c": "x"}), "metadata.labels", "a valid label key must consist of"),
    (
        "nine counter sets",
        counters_only(sharedCounters=[{"name": f"s{i}", "counters": {}} for i in range(9)]),
        "spec.sharedCounters",
        "Too many: 9: must have at most 8 items",
    ),
    # validateCounterSet / validateDeviceCounterConsumption: an empty counters map is refused
    # ("spec.sharedCounters[0].counters: Required value", as NVIDIA's DynamicMIG met it).
    (
        "counter set without counters",
        counters_only(sharedCounters=[{"name": "gpu-0-counter-set", "counters": {}}]),
        "spec.sharedCounters[0].counters",
        "Required value",
    ),
    (
        "counter set without a name",
        counters_only(sharedCounters=[{"name": "", "counters": {"memory": {"value": "1"}}}]),
        "spec.sharedCounters[0].name",
        "Required value",
    ),
    (
        "consumption without counters",
        with_devices(device("d", consumesCounters=[{"counterSet": "gpu-0-counter-set", "counters": {}}])),
        "spec.devices[0].consumesCounters[0].counters",
        "Required value",
    ),
    (
        "consumption without a counter set",
        with_devices(device("d", consumesCounters=[{"counterSet": "", "counters": {"m": {"value": "1"}}}])),
        "spec.devices[0].consumesCounters[0].counterSet",
        "Required value",
    ),
    (
        "counter name not a DNS label",
        counters_only(sharedCounters=[{"name": "s", "counters": {"Memory_Slice": {"value": "1"}}}]),
        "spec.sharedCounters[0].counters",
        "a lowercase RFC 1123 label must consist of",
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
    drop_disabled_fields(body)  # as a default server does first (list attributes: alpha, off)
    errors = validate_slice(body)
    assert any(e.field == path and text in e.body for e in errors), [str(e) for e in errors]


# -- the same tables on a real kube-apiserver (tests/testing/kubeapi/real_api.py) --------------------------


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
