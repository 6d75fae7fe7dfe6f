"""Prepare and unprepare, claim by claim, against the checkpoint and the CDI directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DeviceSpec, Mount
from devplug._dra.checkpoint import FILE_NAME, Checkpoint
from devplug.dra import AllocatedDevice, Claim, ClaimRef, OpaqueConfig, PreparedDevice
from tests.dra.claims_kit import DRIVER, NODE, World, claim
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio


async def test_prepare_writes_one_spec_per_claim_and_is_idempotent(tmp_path: Path) -> None:
    w = World(tmp_path)
    ref = w.add(claim("u1", [("a", "w0"), ("a", "w1"), ("b", "w2")]))
    first = (await w.preparer.prepare([ref]))["u1"]
    assert not first.error
    assert [(d.device, d.requests) for d in first.devices] == [
        ("w0", ("a",)),
        ("w1", ("a",)),
        ("w2", ("b",)),
    ]
    kind = f"k8s.{DRIVER}/claim"
    assert first.devices[0].cdi_device_ids[0] == f"{kind}=u1-a"
    assert first.devices[1].cdi_device_ids == ()  # one CDI name per request, on its first device
    assert first.devices[2].cdi_device_ids[0] == f"{kind}=u1-b"
    assert "example.com/widget=w2" in first.devices[2].cdi_device_ids  # the allocation's own CDI names
    spec_path = w.cdi / f"k8s.{DRIVER}-claim_u1.json"
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == kind
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert by_name["u1-a"]["env"] == ["WIDGETS=w0,w1"]
    assert [n["path"] for n in by_name["u1-a"]["deviceNodes"]] == ["/dev/w0", "/dev/w1"]
    assert w.plugin.allocations == [["w0", "w1"], ["w2"]]
    again = (await w.preparer.prepare([ref]))["u1"]
    assert again.devices == first.devices
    assert w.plugin.allocations == [["w0", "w1"], ["w2"]]  # answered from the checkpoint
    spec_path.unlink()
    assert (await w.preparer.prepare([ref]))["u1"].devices == first.devices
    assert json.loads(spec_path.read_text()) == spec  # rewritten after it went missing


async def test_checkpoint_survives_a_restart_and_unprepare_needs_no_api(tmp_path: Path) -> None:
    w = World(tmp_path)
    ref = w.add(claim("u1", [("a", "w0")]))
    await w.preparer.prepare([ref])
    w.claims.clear()  # the claim is gone from the API server
    w.checkpoint.load()  # a new process reads the file
    assert list(w.checkpoint.claims) == ["u1"]
    result = await w.make().unprepare([ref, ClaimRef("ns", "x", "never")])
    assert {uid: o.error for uid, o in result.items()} == {"u1": "", "never": ""}
    assert not list(w.cdi.iterdir())
    w.checkpoint.load()
    assert w.checkpoint.claims == {}


async def test_a_checkpoint_in_an_earlier_version_s_layout_loads(tmp_path: Path) -> None:
    # Indented, the checksum a member among the others: as earlier versions wrote it, which the
    # other pod of a rolling update may still do. The checksum covers the content, not the layout.
    w = World(tmp_path)
    await w.preparer.prepare([w.add(claim("u1", [("a", "w0"), ("b", "w1")]))])
    path = tmp_path / FILE_NAME
    written = json.loads(path.read_text())
    assert list(written)[-1] == "checksum"
    path.write_text(json.dumps(written, indent=1, sort_keys=True))
    again = Checkpoint(path, DRIVER, NODE)
    again.load()
    assert again.error is None
    assert again.claims == w.checkpoint.claims
    result = await w.make().unprepare([ClaimRef("ns", "c-u1", "u1")])
    assert result["u1"].error == ""
    assert json.loads(path.read_text())["claims"] == {}


async def test_per_claim_errors(tmp_path: Path) -> None:
    w = World(tmp_path)
    ok = w.add(claim("ok", [("a", "w0")]))
    replaced = w.add(claim("new-uid", [("a", "w1")]))
    replaced = ClaimRef(replaced.namespace, replaced.name, "old-uid")
    unallocated = w.add({"metadata": {"uid": "u3", "namespace": "ns", "name": "c-u3"}, "status": {}})
    unknown = w.add(claim("u4", [("a", "nope")]))
    taken = w.add(claim("u5", [("a", "w0")]))
    other_pool = w.add(
        {
            **claim("u6", []),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "a", "driver": DRIVER, "pool": "node-2", "device": "w3"}]
                    }
                }
            },
        }
    )
    missing = ClaimRef("ns", "gone", "u7")
    result = await w.preparer.prepare([ok, replaced, unallocated, unknown, taken, other_pool, missing])
    errors = {uid: o.error for uid, o in result.items()}
    assert errors["ok"] == ""
    assert "got replaced" in errors["old-uid"]
    assert errors["u3"] == "claim ns/c-u3 is not allocated"
    assert "device nope is not one of driver widget.example.com's devices" in errors["u4"]
    assert "device w0 is already prepared for claim ns/c-ok (ok)" in errors["u5"]
    assert "pool 'node-2'" in errors["u6"]
    assert errors["u7"] == "claim ns/gone not found"
    assert set(w.checkpoint.claims) == {"ok"}


async def test_duplicate_uids_and_other_drivers(tmp_path: Path) -> None:
    w = World(tmp_path)
    mixed = claim("u1", [("a", "w0")])
    mixed["status"]["allocation"]["devices"]["results"].append(
        {"request": "a", "driver": "other.example.com", "pool": NODE, "device": "w1"}
    )
    ref = w.add(mixed)
    twin = ClaimRef("ns", "someone-else", "u1")
    result = await w.preparer.prepare([ref, ref])
    assert [d.device for d in result["u1"].devices] == ["w0"]  # the other driver's device is not ours
    result = await w.preparer.unprepare([ref, twin])
    assert "named twice" in result["u1"].error


async def test_a_prepare_finishing_after_its_unprepare_is_refused(tmp_path: Path) -> None:
    w = World(tmp_path)
    ref = w.add(claim("u1", [("a", "w0")]))
    release = anyio.Event()
    fetch = w.fetch

    async def slow_fetch(namespace: str, name: str) -> dict[str, Any]:
        await release.wait()
        return await fetch(namespace, name)

    preparer = w.make()
    preparer._fetch = slow_fetch
    outcome: dict[str, Any] = {}

    async def prepare() -> None:
        outcome.update(await preparer.prepare([ref]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(prepare)
        await anyio.sleep(0.01)
        assert (await preparer.unprepare([ref]))["u1"].error == ""
        release.set()
    assert "unprepared while this prepare was in progress" in outcome["u1"].error
    assert not w.checkpoint.claims
    # A prepare that starts after the unprepare is a new one and goes through.
    preparer._fetch = fetch
    assert (await preparer.prepare([ref]))["u1"].error == ""


def _other_driver(path: Path) -> None:
    Checkpoint(path, "x.example.com", NODE).save()  # a valid file, of another driver


def _other_node(path: Path) -> None:
    Checkpoint(path, DRIVER, "node-2").save()


def _edited(path: Path) -> None:
    path.write_text(path.read_text().replace('"w0"', '"w9"'))


def _truncated(path: Path) -> None:
    path.write_text(path.read_text()[:20])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_edited, "checksum mismatch"),
        (_truncated, "unusable"),
        (_other_driver, "belongs to driver 'x.example.com'"),
        (_other_node, "on node 'node-2'"),
    ],
)
async def test_an_unusable_checkpoint_fails_closed(tmp_path: Path, damage: Any, message: str) -> None:
    w = World(tmp_path)
    await w.preparer.prepare([w.add(claim("u1", [("a", "w0")]))])
    path = tmp_path / FILE_NAME
    damage(path)
    damaged = path.read_bytes()
    w.checkpoint.load()
    assert w.checkpoint.error is not None
    assert message in w.checkpoint.error
    result = await w.preparer.prepare([w.add(claim("u2", [("a", "w1")]))])
    assert message in result["u2"].error
    result = await w.preparer.unprepare([ClaimRef("ns", "c-u1", "u1")])
    assert message in result["u1"].error
    assert path.read_bytes() == damaged  # never reset


class Hooked(Widgets):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Claim, list[str], list[OpaqueConfig]]] = []
        self.unprepared: list[str] = []

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        self.seen.append((claim, [d.name for d in devices], list(config)))
        if claim.name == "c-default":
            return None
        return [PreparedDevice(name=d.name, cdi_devices=(f"example.com/widget={d.name}",)) for d in devices]

    async def unprepare_claim(self, claim: Claim) -> None:
        self.unprepared.append(claim.uid)


async def test_prepare_claim_hook_and_configs(tmp_path: Path) -> None:
    plugin = Hooked()
    w = World(tmp_path, plugin)
    config = [
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": DRIVER, "parameters": {"n": 2}}},
        {"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER, "parameters": {"n": 1}}},
        {"source": "FromClass", "requests": [], "opaque": {"driver": "other.example.com", "parameters": {}}},
        {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {"n": 3}}},
    ]
    ref = w.add(claim("u1", [("a/small", "w0")], config=config))
    result = (await w.preparer.prepare([ref]))["u1"]
    assert result.devices[0].cdi_device_ids == ("example.com/widget=w0",)
    assert result.devices[0].requests == ("a",)
    seen_claim, names, configs = plugin.seen[0]
    assert seen_claim.resource_claim is not None
    assert names == ["w0"]
    assert [c.parameters["n"] for c in configs] == [1, 2]  # class first; b's config is not for a
    assert not (w.cdi.exists() and list(w.cdi.iterdir()))  # the hook wrote no spec: none by devplug
    default = w.add(
        {**claim("u2", [("a", "w1")]), "metadata": {"uid": "u2", "namespace": "ns", "name": "c-default"}}
    )
    assert (await w.preparer.prepare([default]))["u2"].devices[0].cdi_device_ids[0].endswith("=u2-a")
    await w.preparer.unprepare([ref])
    assert plugin.unprepared == ["u1"]


async def test_a_failing_allocate_is_the_claim_s_error_and_leaves_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.plugin.fail_allocate = "no widgets today"
    result = await w.preparer.prepare([w.add(claim("u1", [("a", "w0")]))])
    assert "no widgets today" in result["u1"].error
    assert not w.checkpoint.claims
    assert not w.cdi.exists() or not list(w.cdi.iterdir())


def test_mounts_and_specs_in_the_cdi_spec() -> None:
    from devplug._dra.claims import _claim_spec

    spec = _claim_spec(
        DRIVER,
        "u1",
        {
            "u1-a": ContainerAllocation(
                mounts=(Mount(host_path="/h", container_path="/c", read_only=True),),
                devices=(DeviceSpec.rw("/dev/x"),),
                annotations={"k": "v"},
            )
        },
    ).to_dict()
    device = spec["devices"][0]  # type: ignore[index]
    assert device["containerEdits"]["mounts"] == [
        {"hostPath": "/h", "containerPath": "/c", "options": ["ro", "nosuid", "nodev", "bind"]}
    ]
    assert device["annotations"] == {"k": "v"}
    assert Device(id="x").healthy


async def test_two_drivers_sharing_the_lock_read_each_others_writes(tmp_path: Path) -> None:
    """The old and the new pod of a rolling update: one lock file, one checkpoint file, each its
    own Checkpoint in memory. Each sees what the other wrote before it acts (a changed file is
    read again; an unchanged one is not), and waits while the other holds the lock."""
    import fcntl
    import os

    old, new = World(tmp_path, lock_file=tmp_path / "lock"), World(tmp_path, lock_file=tmp_path / "lock")
    first, second = claim("u1", [("a", "w0")]), claim("u2", [("a", "w0")])
    for w in (old, new):
        w.add(first)
        w.add(second)
    r1, r2 = ClaimRef("ns", "c-u1", "u1"), ClaimRef("ns", "c-u2", "u2")
    assert not (await old.preparer.prepare([r1]))["u1"].error
    taken = (await new.preparer.prepare([r2]))["u2"]
    assert taken.error and "w0" in taken.error  # the new pod read the old one's claim on w0
    assert old.checkpoint.unchanged() and not new.checkpoint.claims.keys() - {"u1"}
    assert not (await new.preparer.unprepare([r1]))["u1"].error  # the new pod undoes the old one's claim
    assert not old.checkpoint.unchanged()
    assert not (await old.preparer.prepare([r2]))["u2"].error  # w0 is free again: the old pod saw that
    assert set(json.loads((tmp_path / FILE_NAME).read_text())["claims"]) == {"u2"}

    fd = os.open(tmp_path / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a third holder: the next unprepare waits for it
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def unprepare() -> None:
                assert not (await new.preparer.unprepare([r2]))["u2"].error
                done.set()

            tg.start_soon(unprepare)
            await wait_until(lambda: any(e["event"] == "lock_wait" for e in logs))
            assert not done.is_set()
            os.close(fd)
            with anyio.fail_after(5):
                await done.wait()
    assert json.loads((tmp_path / FILE_NAME).read_text())["claims"] == {}
