"""A prepare that fails after a plugin's prepare_claim hook returned is undone through that
plugin's unprepare_claim, as an unprepare would undo it, even when the call is cancelled."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from devplug.dra import AllocatedDevice, CdiSpecFile, Claim, OpaqueConfig, PreparedDevice
from tests.dra.claims_kit import DRIVER, NODE, World
from tests.support import Widgets

pytestmark = pytest.mark.anyio

SPEC = CdiSpecFile(name=f"k8s.{DRIVER}-claim_u1.json", text='{"cdiVersion": "0.6.0"}')


class Reversible(Widgets):
    """Prepares with a hook that hands over a spec file (or answers ``answer``), fails with
    ``fail``, or waits for ever with ``hold``; records the claims it was asked to undo."""

    def __init__(self, resource: str | None = None, **behaviour: Any) -> None:
        super().__init__(resource)
        self.behaviour = behaviour
        self.prepared: list[str] = []
        self.unprepared: list[str] = []
        self.entered = anyio.Event()

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        self.entered.set()
        if self.behaviour.get("hold"):
            await anyio.sleep_forever()
        if self.behaviour.get("fail"):
            raise RuntimeError(self.behaviour["fail"])
        self.prepared.append(claim.uid)
        answer = self.behaviour.get("answer")
        if answer is not None:
            return list(answer(devices))
        return [
            PreparedDevice(name=d.name, cdi_devices=("k8s.x/claim=a",), cdi_spec_file=SPEC) for d in devices
        ]

    async def unprepare_claim(self, claim: Claim) -> None:
        await anyio.lowlevel.checkpoint()  # cancelled here unless the rollback is shielded
        if self.behaviour.get("fail_unprepare"):
            raise RuntimeError(self.behaviour["fail_unprepare"])
        self.unprepared.append(claim.uid)


def claim_of(uid: str, devices: Sequence[str]) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"c-{uid}"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
                    ]
                }
            }
        },
    }


def names(w: World, plugin: Widgets) -> list[str]:
    """The DRA names of ``plugin``'s devices in ``w``'s driver."""
    return [e.name for e in w.inventory.current.entries if e.plugin is plugin]


def unwritable(w: World) -> None:
    def save() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    w.checkpoint.save = save  # type: ignore[method-assign]


def stranger(devices: Sequence[AllocatedDevice]) -> list[PreparedDevice]:
    return [PreparedDevice(name="not-asked-for")]


def two_specs(devices: Sequence[AllocatedDevice]) -> list[PreparedDevice]:
    other = CdiSpecFile(name="other.json", text="{}")
    return [
        PreparedDevice(name=d.name, cdi_spec_file=spec)
        for d, spec in zip(devices, (SPEC, other), strict=False)
    ]


@pytest.mark.parametrize(
    ("behaviour", "broken", "error"),
    [
        ({}, unwritable, "cannot write the checkpoint: no space left on the device"),
        (
            {"answer": stranger},
            None,
            "prepare_claim returned not-asked-for, which is not a device of this claim",
        ),
        ({"answer": two_specs}, None, "handed over two CDI specs"),
    ],
    ids=["checkpoint_write", "refused_answer", "spec_conflict"],
)
async def test_a_prepare_failing_after_the_hook_is_undone_by_unprepare_claim(
    tmp_path: Path, behaviour: dict[str, Any], broken: Any, error: str
) -> None:
    plugin = Reversible(**behaviour)
    w = World(tmp_path, plugin)
    if broken is not None:
        broken(w)
    ref = w.add(claim_of("u1", ["w0", "w1"]))
    result = (await w.preparer.prepare([ref]))["u1"]
    assert error in result.error
    assert plugin.prepared == ["u1"]
    assert plugin.unprepared == ["u1"]
    assert not w.checkpoint.claims
    assert not w.cdi.exists() or not list(w.cdi.iterdir())  # no spec left either


async def test_only_the_hooks_that_returned_are_undone(tmp_path: Path) -> None:
    # The second resource's hook fails: the first resource's is undone; the failing hook undoes
    # its own work (it knows how far it got), so its unprepare_claim is not called.
    first, second = Reversible("example.com/first"), Reversible("example.com/second", fail="no luck")
    w = World(tmp_path, first, others=[second])
    ref = w.add(claim_of("u1", [*names(w, first)[:1], *names(w, second)[:1]]))
    result = (await w.preparer.prepare([ref]))["u1"]
    assert "no luck" in result.error
    assert first.unprepared == ["u1"]
    assert second.unprepared == []
    assert not w.checkpoint.claims


async def test_a_failing_rollback_is_logged_and_the_original_error_stands(tmp_path: Path) -> None:
    plugin = Reversible(fail_unprepare="daemon will not stop")
    w = World(tmp_path, plugin)
    unwritable(w)
    ref = w.add(claim_of("u1", ["w0"]))
    with capture_logs() as logs:
        result = (await w.preparer.prepare([ref]))["u1"]
    assert "cannot write the checkpoint" in result.error
    assert "daemon will not stop" not in result.error
    failed = [e for e in logs if e["event"] == "rollback_failed"]
    assert len(failed) == 1
    assert failed[0]["log_level"] == "error"
    assert failed[0]["exc_info"] is True
    assert failed[0]["resource"] == plugin.resource_name
    assert failed[0]["claim"] == "ns/c-u1"
    assert "daemon will not stop" in failed[0]["error"]


async def test_the_rollback_runs_when_the_prepare_is_cancelled(tmp_path: Path) -> None:
    # The kubelet gives up on the call (its 45 s deadline): the first resource's hook has
    # returned, the second one's is still running when the call is cancelled.
    first, second = Reversible("example.com/first"), Reversible("example.com/second", hold=True)
    w = World(tmp_path, first, others=[second])
    ref = w.add(claim_of("u1", [*names(w, first)[:1], *names(w, second)[:1]]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(w.preparer.prepare, [ref])
        await second.entered.wait()
        tg.cancel_scope.cancel()
    assert first.prepared == ["u1"]
    assert first.unprepared == ["u1"]
    assert not w.checkpoint.claims
