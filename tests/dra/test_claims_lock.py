"""The lock two pods of a rolling update share is waited for without blocking the event loop,
can be cancelled, and is given up with a per-claim error before the kubelet's deadline."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import grpc
import pytest
from structlog.testing import capture_logs

from devplug._dra.lock import LOCK_MARGIN, LOCK_WAIT, lock_wait
from devplug._proto.dra.v1 import api_pb2 as v1
from devplug._proto.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.testing import FakeKubeAPI
from tests.dra.claims_kit import World, claim
from tests.dra.dra_kit import NODE, driving, notify
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

GUARD = 20.0
"""Seconds after which a test lets go of a lock it holds whatever happened: a driver that waits
for the lock in a thread then finishes, and the test fails on its answer instead of hanging."""


class Holder:
    """The lock held by another process (an open file description of its own: flock locks
    conflict between those even within one process)."""

    def __init__(self, path: Path) -> None:
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    @property
    def holding(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def release_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        self.release()


@contextmanager
def held(path: Path) -> Iterator[Holder]:
    holder = Holder(path)
    try:
        yield holder
    finally:
        holder.release()


@pytest.mark.parametrize(
    ("time_left", "wait"),
    [
        (None, LOCK_WAIT),  # no deadline: the constant
        (45.0, 45.0 - LOCK_MARGIN),  # the kubelet's call, just arrived
        (600.0, LOCK_WAIT),  # a client with a long deadline: no longer than the constant
        (12.0, 12.0 - LOCK_MARGIN),
        (LOCK_MARGIN / 2, 0.0),  # too late to wait at all: one try
    ],
)
def test_the_wait_is_bounded_below_the_deadline(time_left: float | None, wait: float) -> None:
    assert lock_wait(time_left) == pytest.approx(wait)
    assert LOCK_WAIT < 45.0  # under the kubelet's deadline for NodePrepareResources


async def test_a_held_lock_is_given_up_with_a_per_claim_error(tmp_path: Path) -> None:
    lock = tmp_path / "serialize.lock"
    w = World(tmp_path, lock_file=lock)
    ref, other = w.add(claim("u1", [("a", "w0")])), w.add(claim("u2", [("a", "w1")]))
    with held(lock), capture_logs() as logs:
        result = await w.preparer.prepare([ref, other], time_left=LOCK_MARGIN + 0.2)
        unprepared = await w.preparer.unprepare([ref], time_left=LOCK_MARGIN + 0.2)
    for outcome in (result["u1"], result["u2"], unprepared["u1"]):
        assert outcome.error.startswith(f"the driver's lock {lock} is held by another instance")
        assert re.search(r"gave up after \d+\.\d s\b", outcome.error)
    assert not w.checkpoint.claims
    assert [e["log_level"] for e in logs if e["event"] == "lock_wait_expired"] == ["warning", "warning"]
    # Free again: the same preparer takes it (nothing of the failed wait is left held).
    assert (await w.preparer.prepare([ref], time_left=LOCK_MARGIN + 0.2))["u1"].error == ""


async def test_a_wait_for_the_lock_can_be_cancelled(tmp_path: Path) -> None:
    lock = tmp_path / "serialize.lock"
    w = World(tmp_path, lock_file=lock)
    ref = w.add(claim("u1", [("a", "w0")]))
    holder = Holder(lock)
    async with anyio.create_task_group() as guard:
        guard.start_soon(holder.release_after, GUARD)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(w.preparer.prepare, [ref])
                await wait_until(lambda: any(e["event"] == "lock_wait" for e in logs), timeout=GUARD)
                tg.cancel_scope.cancel()
        assert holder.holding  # the prepare returned while the lock was still held
        holder.release()
        guard.cancel_scope.cancel()
    assert not w.checkpoint.claims
    assert (await w.preparer.prepare([ref]))["u1"].error == ""  # the process lock was let go too


async def test_the_driver_answers_before_the_call_s_deadline(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving(
            [Widgets()], api, short_dir, driver_name="widget.example.com", pod_uid="pod-1"
        ) as driver:
            await notify(driver.registration_socket)
            await wait_until(lambda: driver.readiness()[0])
            api.add_claim("ns", "c1", requests=[("a", 1)])
            allocated = api.allocate_claim("ns", "c1", node=NODE, driver="widget.example.com", devices=["w0"])
            uid = allocated["metadata"]["uid"]
            lock = driver.state_dir / "serialize.lock"
            request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", name="c1", uid=uid)])
            async with grpc.aio.insecure_channel(f"unix://{driver.dra_socket}") as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                with held(lock), anyio.move_on_after(GUARD):
                    # The deadline leaves half a second to wait for the lock: the answer comes then.
                    response = await stub.NodePrepareResources(request, timeout=LOCK_MARGIN + 0.5)
            error = response.claims[uid].error
            assert error.startswith(f"the driver's lock {lock} is held by another instance")
            assert not response.claims[uid].devices
