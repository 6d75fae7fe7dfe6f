"""Watches, held against the real API server: each test runs against FakeKubeAPI and against a
real kube-apiserver with etcd (tests/testing/kubeapi/real_api.py), with the same assertions.

What only the fake can be made to do on demand (compaction, a bounded history, bookmarks every
0.1 s) stays in test_kubeapi_watch.py; here the real server decides.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio
import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceSlice

from tests.testing.kubeapi.real_api import Kube
from tests.testing.kubeapi.test_kubeapi_kit import NODE, SLICES, slice_body

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(kube: Kube) -> AsyncIterator[lightkube.AsyncClient]:
    async with kube.client() as c:
        yield c


async def first(client: lightkube.AsyncClient, n: int, **kwargs: Any) -> list[tuple[str, str, int]]:
    """The first ``n`` events of a watch: (type, name, resourceVersion)."""
    seen: list[tuple[str, str, int]] = []
    with anyio.fail_after(10):
        async with aclosing(client.watch(ResourceSlice, **kwargs)) as events:
            async for type_, obj in events:
                seen.append((type_, obj.metadata.name, int(obj.metadata.resourceVersion)))
                if len(seen) == n:
                    break
    return seen


async def raw_lines(kube: Kube, n: int | None, **params: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Watch events as JSON lines over plain HTTP: the first ``n`` (None: until the server ends)."""
    lines: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async with kube.raw() as http, http.stream("GET", SLICES, params={"watch": "1", **params}) as answer:
            headers = dict(answer.headers)
            async for line in answer.aiter_lines():
                lines.append(json.loads(line))
                if n is not None and len(lines) == n:
                    break
    return lines, headers


async def test_replay_from_a_resource_version(client: lightkube.AsyncClient) -> None:
    before = await client.create(ResourceSlice.from_dict(slice_body("old")))
    await client.create(ResourceSlice.from_dict(slice_body("s1")))
    await client.patch(ResourceSlice, "s1", {"metadata": {"labels": {"x": "y"}}})
    await client.delete(ResourceSlice, "s1")
    events = await first(client, 3, resource_version=before.metadata.resourceVersion)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "s1"), ("MODIFIED", "s1"), ("DELETED", "s1")]
    rvs = [rv for _, _, rv in events]
    assert rvs == sorted(rvs)
    assert rvs[0] > int(before.metadata.resourceVersion)


@pytest.mark.parametrize("rv", [None, "0"])
async def test_without_a_version_current_objects_come_first_as_added(
    client: lightkube.AsyncClient, rv: str | None
) -> None:
    await client.create(ResourceSlice.from_dict(slice_body("b")))
    await client.create(ResourceSlice.from_dict(slice_body("a")))
    events = await first(client, 2, resource_version=rv)
    assert sorted((t, n) for t, n, _ in events) == [("ADDED", "a"), ("ADDED", "b")]


async def test_live_events_and_a_field_selector(client: lightkube.AsyncClient) -> None:
    seen: list[tuple[str, str, int]] = []

    async def watch() -> None:
        seen.extend(await first(client, 2, fields={"spec.nodeName": NODE}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.5)
        await client.create(ResourceSlice.from_dict(slice_body("other", node="node-2")))
        await client.create(ResourceSlice.from_dict(slice_body("mine")))
        await client.delete(ResourceSlice, "other")
        await client.delete(ResourceSlice, "mine")
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "mine"), ("DELETED", "mine")]


async def test_leaving_and_entering_a_label_selection(client: lightkube.AsyncClient) -> None:
    start = await client.create(ResourceSlice.from_dict(slice_body("s1")))
    await client.patch(ResourceSlice, "s1", {"metadata": {"labels": {"tier": "gold"}}})
    await client.patch(ResourceSlice, "s1", {"metadata": {"labels": {"tier": "lead"}}})
    events = await first(client, 2, labels={"tier": "gold"}, resource_version=start.metadata.resourceVersion)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "s1"), ("DELETED", "s1")]


async def test_an_old_version_replays_until_compacted(kube: Kube, client: lightkube.AsyncClient) -> None:
    """Resource version 1: both replay what came since (the real server from etcd, which compacts
    every 5 minutes); once compacted (the fake on demand), 410 Expired in the same words."""
    await client.create(ResourceSlice.from_dict(slice_body("s1")))
    replayed = await first(client, 1, resource_version="1")
    assert replayed[0][0] in ("ADDED", "MODIFIED", "DELETED")
    if kube.fake is None:
        return
    kube.fake.compact()
    with pytest.raises(ApiError) as gone:
        await first(client, 1, resource_version="1")
    assert gone.value.status.code == 410
    assert gone.value.status.reason == "Expired"
    assert gone.value.status.message.startswith("too old resource version: 1 (")


async def test_the_stream_is_chunked_json_lines_and_times_out(kube: Kube) -> None:
    started = anyio.current_time()
    lines, headers = await raw_lines(kube, None, timeoutSeconds="1", fieldSelector="spec.nodeName=nowhere")
    assert lines == []
    assert 0.9 <= anyio.current_time() - started < 5
    assert headers["transfer-encoding"] == "chunked"
    assert headers["content-type"] == "application/json"


async def test_initial_events_end_with_a_bookmark(kube: Kube, client: lightkube.AsyncClient) -> None:
    await client.create(ResourceSlice.from_dict(slice_body("s1")))
    lines, _ = await raw_lines(
        kube, 2, sendInitialEvents="true", allowWatchBookmarks="true", resourceVersionMatch="NotOlderThan"
    )
    assert [line["type"] for line in lines] == ["ADDED", "BOOKMARK"]
    marker = lines[1]["object"]
    assert marker["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert marker["kind"] == "ResourceSlice"
    assert int(marker["metadata"]["resourceVersion"]) >= int(
        lines[0]["object"]["metadata"]["resourceVersion"]
    )


@pytest.mark.parametrize("rv", ["abc", "-1"])
async def test_a_bad_resource_version_is_400_for_a_list_and_500_for_a_watch(kube: Kube, rv: str) -> None:
    why = f'resourceVersion: Invalid value: "{rv}": strconv.ParseUint: parsing "{rv}": invalid syntax'
    async with kube.raw() as http:
        listed = await http.get(SLICES, params={"resourceVersion": rv})
        watched = await http.get(SLICES, params={"watch": "true", "resourceVersion": rv})
    assert listed.status_code == 400, listed.text
    assert listed.json()["reason"] == "BadRequest"
    assert listed.json()["message"] == f"invalid resource version: {why}"
    assert watched.status_code == 500, watched.text
    assert "reason" not in watched.json()
    assert watched.json()["message"] == why
