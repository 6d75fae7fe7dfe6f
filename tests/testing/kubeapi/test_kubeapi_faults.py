"""FakeKubeAPI fault injection: outages, injected statuses, slow answers, the request record."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice

from devplug.testing import FakeKubeAPI, RecordedRequest
from tests.testing.kubeapi.test_kubeapi_kit import NODE, SLICES, raw, slice_body

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    async with FakeKubeAPI(user="system:serviceaccount:dra:driver") as server:
        server.add_node(NODE)
        yield server


async def test_outage_refuses_and_resets_then_restore_serves_the_same_objects(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    await client.create(ResourceSlice.from_dict(slice_body("s1")))
    url = api.url
    broken: list[BaseException] = []
    ended = anyio.Event()

    async def watch() -> None:
        try:
            async for _ in client.watch(ResourceSlice, resource_version="0"):
                pass
        except httpx2.HTTPError as exc:
            broken.append(exc)
        ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.2)
        api.outage()
        with pytest.raises(httpx2.ConnectError):
            await client.get(ResourceSlice, "s1")
        with anyio.fail_after(5):
            await ended.wait()
    assert isinstance(broken[0], (httpx2.ReadError, httpx2.RemoteProtocolError))
    api.restore()
    assert api.url == url
    assert (await client.get(ResourceSlice, "s1")).metadata.name == "s1"
    api.restore()  # already serving: nothing happens


async def test_forbidden_in_the_authorizers_words_a_given_number_of_times(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    api.fail(status=403, verbs=("create",), resource="resourceslices", times=2)
    for _ in range(2):
        with pytest.raises(ApiError) as refused:
            await client.create(ResourceSlice.from_dict(slice_body("s1")))
        assert refused.value.status.code == 403
        assert refused.value.status.reason == "Forbidden"
        assert refused.value.status.message == (
            'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:dra:driver" '
            'cannot create resource "resourceslices" in API group "resource.k8s.io" at the cluster scope'
        )
    await client.create(ResourceSlice.from_dict(slice_body("s1")))
    assert [r.status for r in api.requests if r.verb == "create"] == [403, 403, 201]
    assert api.requests[-1] == RecordedRequest("create", SLICES, 201)


async def test_other_statuses_subresources_and_cancelling(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    api.add_claim("ns", "c")
    fault = api.fail(status=500, verbs=None, resource="resourceclaims", name="c")
    with pytest.raises(ApiError) as broken:
        await client.get(ResourceClaim, "c", namespace="ns")
    assert broken.value.status.code == 500
    assert broken.value.status.reason == "InternalError"
    fault.cancel()
    claim = await client.get(ResourceClaim, "c", namespace="ns")
    api.fail(status=403, verbs=("update",), resource="resourceclaims/status")
    with pytest.raises(ApiError) as refused:
        await client.replace(ResourceClaimStatus.from_dict(claim.to_dict()), namespace="ns")
    assert refused.value.status.message == (
        'resourceclaims.resource.k8s.io "c" is forbidden: User "system:serviceaccount:dra:driver" '
        'cannot update resource "resourceclaims/status" in API group "resource.k8s.io" in the namespace "ns"'
    )
    api.fail(status=429, verbs=("list",), resource=None, message="slow down")
    async with raw(api.url) as http:
        limited = await http.get(SLICES)
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "1"
    assert limited.json()["message"] == "slow down"
    api.clear_faults()
    assert [s.metadata.name async for s in client.list(ResourceSlice)] == []


async def test_slow_answers(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    async def timed_list() -> float:
        started = anyio.current_time()
        assert [s async for s in client.list(ResourceSlice)] == []
        return anyio.current_time() - started

    api.slow(0.3)
    assert await timed_list() >= 0.3
    api.slow(0)
    assert await timed_list() < 0.3


async def test_the_request_record(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    await client.create(ResourceSlice.from_dict(slice_body("s1")))
    with pytest.raises(ApiError):
        await client.get(ResourceSlice, "nope")
    await client.delete(ResourceSlice, "s1")
    assert api.requests == [
        RecordedRequest("create", SLICES, 201),
        RecordedRequest("get", f"{SLICES}/nope", 404),
        RecordedRequest("delete", f"{SLICES}/s1", 200),
    ]
