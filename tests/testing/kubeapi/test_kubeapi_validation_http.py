"""FakeKubeAPI's validation over HTTP: 422 Status objects, 400 for undecodable bodies, dropped taints."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable

import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceSlice

from devplug.testing import FakeKubeAPI
from tests.testing.kubeapi.test_kubeapi_kit import (
    Body,
    device,
    pool,
    post_slice,
    raw,
    slice_body,
    taint,
    with_devices,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    async with FakeKubeAPI() as server:
        yield server


async def test_422_message_and_causes(api: FakeKubeAPI) -> None:
    body = slice_body("x", devices=[device("A_b")])
    async with raw(api.url) as http:
        one = await post_slice(http, body)
        body["spec"]["pool"]["generation"] = -1
        two = await post_slice(http, body)
    assert one.status_code == 422
    status = one.json()
    assert status["kind"] == "Status"
    assert status["apiVersion"] == "v1"
    assert status["status"] == "Failure"
    assert status["reason"] == "Invalid"
    assert status["code"] == 422
    assert status["message"] == (
        'ResourceSlice.resource.k8s.io "x" is invalid: spec.devices[0].name: Invalid value: "A_b": '
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
        "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
        "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    )
    assert status["details"]["kind"] == "ResourceSlice"
    assert status["details"]["group"] == "resource.k8s.io"
    assert status["details"]["causes"][0]["field"] == "spec.devices[0].name"
    assert status["details"]["causes"][0]["reason"] == "FieldValueInvalid"
    message = two.json()["message"]
    assert message.startswith(
        'ResourceSlice.resource.k8s.io "x" is invalid: [spec.pool.generation: Invalid value: -1'
    )
    assert message.endswith("]")
    assert api.slices() == []


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (
            pool(generation="1"),
            "cannot unmarshal string into Go struct field ResourcePool.spec.pool.generation of type int64",
        ),
        (
            with_devices(device("d", capacity={"m": {"value": "lots"}})),
            "quantities must match the regular expression",
        ),
    ],
)
async def test_undecodable_bodies_are_400(
    api: FakeKubeAPI, change: Callable[[Body], None], text: str
) -> None:
    body = slice_body()
    change(body)
    async with raw(api.url) as http:
        answer = await post_slice(http, body)
    assert answer.status_code == 400
    assert answer.json()["reason"] == "BadRequest"
    assert answer.json()["message"].startswith(
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: '
    )
    assert text in answer.json()["message"]


@pytest.mark.parametrize("gate", [True, False])
async def test_taints_dropped_without_the_feature_gate(gate: bool) -> None:
    body = slice_body(devices=[device("gpu-0", taints=[taint(effect="NoExecute")])])
    async with FakeKubeAPI(device_taints=gate) as api, api.client() as client:
        created = await client.create(ResourceSlice.from_dict(copy.deepcopy(body)))
        (stored,) = api.slices()
        replaced = await client.replace(created)
    assert (created.spec.devices[0].taints is not None) is gate
    assert ("taints" in stored["spec"]["devices"][0]) is gate
    assert (replaced.spec.devices[0].taints is not None) is gate


async def test_resource_version_on_create_is_an_internal_error(api: FakeKubeAPI) -> None:
    async with api.client() as client:
        body = slice_body()
        body["metadata"]["resourceVersion"] = "5"
        with pytest.raises(ApiError) as refused:
            await client.create(ResourceSlice.from_dict(body))
    assert refused.value.status.code == 500
    assert (
        refused.value.status.message
        == "Internal error occurred: resourceVersion should not be set on objects to be created"
    )
