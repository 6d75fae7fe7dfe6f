"""FakeKubeAPI watches: replay from a resourceVersion, live events, 410 Expired, selectors, bookmarks."""

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

from devplug.testing import FakeKubeAPI
from tests.testing.test_kubeapi_kit import NODE, SLICES, raw, slice_body

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    async with FakeKubeAPI(event_history=20) as server:
        yield server


async def first(client: lightkube.AsyncClient, n: int, **kwargs: Any) -> list[tuple[str, str, int]]:
    """The first ``n`` events of a watch: (type, name, resourceVersion)."""
    seen: list[tuple[str, str, int]] = []
    with anyio.fail_after(5):
        async with aclosing(client.watch(ResourceSlice, **kwargs)) as events:
            async for type_, obj in events:
                seen.append((type_, obj.metadata.name, int(obj.metadata.resourceVersion)))
                if len(seen) == n:
                    break
    return seen


async def test_replay_from_a_resource_version(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
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
    await client.create(ResourceSlice.from_dict(slice_body("a")))
    await client.create(ResourceSlice.from_dict(slice_body("b")))
    assert [(t, n) for t, n, _ in await first(client, 2, resource_version=rv)] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]


async def test_live_events_and_a_field_selector(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    api.add_node("node-2")
    seen: list[tuple[str, str, int]] = []

    async def watch() -> None:
        seen.extend(await first(client, 2, fields={"spec.nodeName": NODE}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.1)
        await client.create(ResourceSlice.from_dict(slice_body("other", node="node-2")))
        await client.create(ResourceSlice.from_dict(slice_body("mine")))
        api.wipe_slices(NODE)
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "mine"), ("DELETED", "mine")]


async def test_leaving_and_entering_a_label_selection(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    start = await client.create(ResourceSlice.from_dict(slice_body("s1")))
    await client.patch(ResourceSlice, "s1", {"metadata": {"labels": {"tier": "gold"}}})
    await client.patch(ResourceSlice, "s1", {"metadata": {"labels": {"tier": "lead"}}})
    events = await first(client, 2, labels={"tier": "gold"}, resource_version=start.metadata.resourceVersion)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "s1"), ("DELETED", "s1")]


async def test_a_compacted_version_is_410_gone(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    start = await client.create(ResourceSlice.from_dict(slice_body("s1")))
    later = await client.create(ResourceSlice.from_dict(slice_body("s2")))
    api.compact()
    # Up to date is still fine: nothing after its version was forgotten.
    await client.create(ResourceSlice.from_dict(slice_body("s3")))
    events = await first(client, 1, resource_version=later.metadata.resourceVersion)
    assert [n for _, n, _ in events] == ["s3"]
    with pytest.raises(ApiError) as gone:
        await first(client, 1, resource_version=start.metadata.resourceVersion)
    assert gone.value.status.code == 410
    assert gone.value.status.reason == "Expired"
    assert gone.value.status.message.startswith(
        f"too old resource version: {start.metadata.resourceVersion} ("
    )


async def test_the_history_is_bounded(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    start = await client.create(ResourceSlice.from_dict(slice_body("s1")))
    for generation in range(1, 25):  # more writes than the history (20) keeps
        await client.patch(ResourceSlice, "s1", {"spec": {"pool": {"generation": generation}}})
    with pytest.raises(ApiError) as gone:
        await first(client, 1, resource_version=start.metadata.resourceVersion)
    assert gone.value.status.code == 410
    recent = await client.get(ResourceSlice, "s1")
    await client.patch(ResourceSlice, "s1", {"spec": {"pool": {"generation": 99}}})
    assert [t for t, _, _ in await first(client, 1, resource_version=recent.metadata.resourceVersion)] == [
        "MODIFIED"
    ]


async def raw_lines(
    api: FakeKubeAPI, n: int | None, **params: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Watch events as JSON lines over plain HTTP: the first ``n`` (None: until the server ends)."""
    lines: list[dict[str, Any]] = []
    with anyio.fail_after(5):
        async with (
            raw(api.url) as http,
            http.stream("GET", SLICES, params={"watch": "1", **params}) as answer,
        ):
            headers = dict(answer.headers)
            async for line in answer.aiter_lines():
                lines.append(json.loads(line))
                if n is not None and len(lines) == n:
                    break
    return lines, headers


async def test_the_stream_is_chunked_json_lines_and_times_out(api: FakeKubeAPI) -> None:
    api.add_node(NODE)
    api.wipe_slices(NODE)
    started = anyio.current_time()
    lines, headers = await raw_lines(api, None, timeoutSeconds="1")
    assert lines == []
    assert 0.9 <= anyio.current_time() - started < 3
    assert headers["transfer-encoding"] == "chunked"
    assert headers["content-type"] == "application/json"


async def test_bookmarks_and_initial_events(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    created = await client.create(ResourceSlice.from_dict(slice_body("s1")))
    api.bookmark_interval = 0.1
    lines, _ = await raw_lines(
        api, 2, sendInitialEvents="true", allowWatchBookmarks="true", resourceVersionMatch="NotOlderThan"
    )
    assert [line["type"] for line in lines] == ["ADDED", "BOOKMARK"]
    marker = lines[1]["object"]
    assert marker["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert marker["kind"] == "ResourceSlice"
    lines, _ = await raw_lines(
        api, 1, allowWatchBookmarks="true", resourceVersion=created.metadata.resourceVersion
    )
    assert lines[0]["type"] == "BOOKMARK"
    assert lines[0]["object"]["metadata"]["resourceVersion"] == created.metadata.resourceVersion
