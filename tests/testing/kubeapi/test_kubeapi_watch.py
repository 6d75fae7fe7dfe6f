"""FakeKubeAPI watches, what only the fake can be made to do on demand: compaction and a bounded
history (410 Expired), bookmarks every 0.1 s. The rest, against the real API server too,
is in test_kubeapi_watch_real.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceSlice

from devplug.testing import FakeKubeAPI
from tests.testing.kubeapi.real_api import Kube
from tests.testing.kubeapi.test_kubeapi_kit import slice_body
from tests.testing.kubeapi.test_kubeapi_watch_real import first, raw_lines

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


async def test_bookmarks_every_interval(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    """A watch with bookmarks gets one each ``bookmark_interval`` at the newest resourceVersion
    (the real server: about every minute; the initial-events bookmark is held against it in
    test_kubeapi_watch_real.py)."""
    created = await client.create(ResourceSlice.from_dict(slice_body("s1")))
    api.bookmark_interval = 0.1
    lines, _ = await raw_lines(
        Kube("fake", api.url, fake=api),
        1,
        allowWatchBookmarks="true",
        resourceVersion=created.metadata.resourceVersion,
    )
    assert lines[0]["type"] == "BOOKMARK"
    assert lines[0]["object"]["metadata"]["resourceVersion"] == created.metadata.resourceVersion
