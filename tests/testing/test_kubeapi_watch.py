"""FakeKubeAPI watches, what only the fake can be made to do on demand: compaction and a bounded
history (410 Expired), bookmarks every 0.1 s. The rest, against the real API server too,
is in test_kubeapi_watch_real.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceSlice

from devplug.testing import FakeKubeAPI
from tests.testing.test_kubeapi_kit import SLICES, raw, slice_body
from tests.testing.test_kubeapi_watch_real import first

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    async with FakeKubeAPI(event_history=20) as server:
        yield server


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
