"""The slice publisher outlives whatever goes wrong: a Node without a UID is asked again after a
pause, and an error that is not an API error (a bad object from the server, a bug) is logged
with its traceback and retried with back-off like one, never ending the driver."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from structlog.testing import capture_logs

from devplug._dra.inventory import Inventory
from devplug._dra.kube import Kube
from devplug._dra.publisher import SlicePublisher
from devplug.testing import FakeKubeAPI
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

NODE = "node-1"
DRIVER = "widget.example.com"


class NoUidClient:
    """A lightkube client whose Node comes back without a UID."""

    async def get(self, kind: Any, name: str, **_: Any) -> Any:
        return Node(metadata=ObjectMeta(name=name))


async def test_a_node_without_a_uid_reads_as_empty() -> None:
    assert await Kube(NoUidClient()).node_uid(NODE) == ""  # type: ignore[arg-type]


class Answers:
    """A Kube whose ``node_uid`` answers from a list."""

    def __init__(self, *uids: str) -> None:
        self.uids = list(uids)
        self.asked = 0

    async def node_uid(self, node: str) -> str:
        self.asked += 1
        return self.uids.pop(0)


async def test_an_empty_node_uid_is_asked_again_after_a_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await anyio.lowlevel.checkpoint()

    kube = Answers("", "", "uid-1")
    publisher = SlicePublisher(
        kube,  # type: ignore[arg-type]
        driver=DRIVER,
        node=NODE,
        inventory=Inventory([Widgets()]),
        log=structlog.get_logger("test"),
    )
    monkeypatch.setattr(anyio, "sleep", sleep)
    with capture_logs() as logs:
        assert await publisher._node_uid() == "uid-1"
    assert kube.asked == 3
    assert len(pauses) == 2
    assert all(p > 0 for p in pauses)
    assert [e["log_level"] for e in logs if e["event"] == "node_uid_missing"] == ["warning", "warning"]
    assert publisher.last_error is not None
    assert f"nodes/{NODE}" in publisher.last_error


class Flaky:
    """A Kube that fails once at ``step`` the way a bug or a bad object from the server would
    (not a KubeError), then behaves."""

    def __init__(self, kube: Kube, step: str) -> None:
        self._kube = kube
        self.step = step
        self.failed = False

    def _once(self, step: str) -> bool:
        if self.step == step and not self.failed:
            self.failed = True
            return True
        return False

    async def node_uid(self, node: str) -> str:
        if self._once("node_uid"):
            raise AttributeError("'NoneType' object has no attribute 'uid'")
        return await self._kube.node_uid(node)

    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        items, version = await self._kube.list_slices(driver, node)
        if self._once("list_slices"):
            items = [*items, {"spec": {}}]  # an object without metadata
        return items, version

    async def watch_slices(
        self, driver: str, node: str, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if self._once("watch_slices"):
            yield "MODIFIED", {"metadata": None}
        async for event in self._kube.watch_slices(driver, node, resource_version):
            yield event

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        stored = await self._kube.create_slice(obj)
        if self._once("create_slice"):
            return {}  # an answer without metadata
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)


@pytest.mark.parametrize("step", ["node_uid", "list_slices", "watch_slices", "create_slice"])
async def test_any_error_is_logged_and_retried(step: str) -> None:
    plugin = Widgets()
    inventory = Inventory([plugin])
    inventory.update(0, plugin.devices)
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kube = Flaky(Kube(api.client()), step)
        publisher = SlicePublisher(
            kube,  # type: ignore[arg-type]
            driver=DRIVER,
            node=NODE,
            inventory=inventory,
            log=structlog.get_logger("test"),
        )
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await wait_until(lambda: kube.failed and publisher.in_sync, timeout=20)
                tg.cancel_scope.cancel()
        await kube.aclose()
        slices = api.slices(node=NODE, driver=DRIVER)
        assert sorted(d["name"] for s in slices for d in s["spec"]["devices"]) == ["w0", "w1", "w2", "w3"]
    failed = [e for e in logs if e["event"] == "publisher_failed"]
    assert failed
    assert failed[0]["log_level"] == "error"
    assert failed[0]["exc_info"] is True
    assert failed[0]["retry_in"] > 0
