"""Shared devices (consumable capacity, KEP-5075): the model, the slices, and prepare and
unprepare per share against the checkpoint."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from devplug import Device
from devplug._dra.inventory import Inventory
from devplug._dra.slices import device_entry
from devplug.dra import AllocatedDevice, CapacityRequestPolicy, Claim, OpaqueConfig, PreparedDevice
from tests.dra.claims_kit import DRIVER, NODE, World
from tests.support import Widgets

pytestmark = pytest.mark.anyio

SHARED = Device(
    id="w0",
    capacity={"shares": 4, "memory": "8Gi"},
    allow_multiple_allocations=True,
    request_policies={
        "shares": CapacityRequestPolicy(default="1", min="1", step="1"),
        "memory": CapacityRequestPolicy(default="1Gi", valid_values=("1Gi", "2Gi", "4Gi")),
    },
)


def shared_claim(uid: str, shares: Sequence[tuple[str, str, str, dict[str, str]]]) -> dict[str, Any]:
    """A claim allocated ``(request, device, share ID, consumed capacity)`` results."""
    results = []
    for request, device, share, consumed in shares:
        result: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE, "device": device}
        if share:
            result["shareID"] = share
        if consumed:
            result["consumedCapacity"] = consumed
        results.append(result)
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"c-{uid}"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


class Sharing(Widgets):
    """Records what its claim hooks learn, and which devices it is told to release."""

    def __init__(self, devices: Sequence[Device] = (SHARED, Device(id="w1"))) -> None:
        super().__init__(devices=devices)
        self.seen: list[tuple[str, str | None, dict[str, str], tuple[str, ...]]] = []
        self.released: list[str] = []
        self.unprepared: list[str] = []

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        for d in devices:
            self.seen.append((claim.uid, d.share_id, d.consumed_capacity, d.other_shares))
        return None

    async def unprepare_claim(self, claim: Claim) -> None:
        self.unprepared.append(claim.uid)

    async def release_device(self, name: str) -> None:
        self.released.append(name)


# -- the model and the slice -------------------------------------------------------------------


def test_a_shared_device_is_published_with_its_policies() -> None:
    inventory = Inventory([Widgets(devices=[SHARED])])
    inventory.update(0, [SHARED])
    entry = device_entry(inventory.current.entries[0], DRIVER, taint_unhealthy=True)
    assert entry["allowMultipleAllocations"] is True
    assert entry["capacity"] == {
        "memory": {
            "value": "8Gi",
            "requestPolicy": {"default": "1Gi", "validValues": ["1Gi", "2Gi", "4Gi"]},
        },
        "shares": {"value": "4", "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}}},
    }
    plain = device_entry(inventory.current.entries[0], DRIVER, taint_unhealthy=True, shares=False)
    assert "allowMultipleAllocations" not in plain
    assert plain["capacity"] == {"memory": {"value": "8Gi"}, "shares": {"value": "4"}}


@pytest.mark.parametrize(
    ("capacity", "policy", "problem"),
    [
        ("4", {"valid_values": ("1", "2")}, "needs a default"),
        ("4", {"default": 1, "valid_values": ("1", "2"), "min": 1}, "valid_values or a range"),
        ("4", {"default": 1, "max": 2}, "a range needs its min"),
        ("4", {"default": 1, "valid_values": ("2", "1")}, "ascending order"),
        ("4", {"default": 1, "valid_values": ("1", "8")}, "valid value 8 is larger than the capacity"),
        ("4", {"default": 3, "valid_values": ("1", "2")}, "default 3 is not one of the valid values"),
        ("4", {"default": 1, "min": 5}, "min 5 is larger than the capacity"),
        ("4", {"default": 1, "min": 1, "max": 8}, "max 8 is larger than the capacity"),
        ("4", {"default": 1, "min": 3, "max": 2}, "min 3 is larger than max 2"),
        ("4", {"default": 4, "min": 1, "max": 2}, "default 4 is outside"),
        ("4", {"default": 1, "min": 1, "step": 0}, "step 0 must be greater than zero"),
        ("4", {"default": 1, "min": 1, "step": 4}, "one step from min"),
        ("8", {"default": 2, "min": 1, "step": 2}, "default is not min plus a multiple of step 2"),
        ("8", {"default": 1, "min": 1, "max": 6, "step": 2}, "max is not min plus a multiple of step 2"),
        ("4", {"default": "1x"}, "not a Kubernetes quantity"),
        ("4", {"default": 1, "valid_values": tuple(str(i) for i in range(11))}, "at most 10 valid values"),
    ],
)
def test_a_policy_the_api_server_would_refuse_is_refused_where_the_device_is_made(
    capacity: str, policy: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        Device(
            id="d",
            capacity={"c": capacity},
            allow_multiple_allocations=True,
            request_policies={"c": CapacityRequestPolicy(**policy)},
        )


def test_policies_need_a_shared_device_and_their_capacity() -> None:
    policy = CapacityRequestPolicy(default=1)
    with pytest.raises(ValidationError, match="need allow_multiple_allocations"):
        Device(id="d", capacity={"c": 2}, request_policies={"c": policy})
    with pytest.raises(ValidationError, match="not one of the device's capacities"):
        Device(id="d", capacity={"c": 2}, allow_multiple_allocations=True, request_policies={"x": policy})


# -- prepare and unprepare -----------------------------------------------------------------------


async def test_shares_of_one_device_are_prepared_for_several_claims(tmp_path: Path) -> None:
    plugin = Sharing()
    w = World(tmp_path, plugin)
    one = w.add(shared_claim("u1", [("gpu", "w0", "s-1", {"shares": "1", "memory": "2Gi"})]))
    two = w.add(shared_claim("u2", [("gpu", "w0", "s-2", {"shares": "2", "memory": "4Gi"})]))
    first = (await w.preparer.prepare([one]))["u1"]
    second = (await w.preparer.prepare([two]))["u2"]
    assert (first.error, second.error) == ("", "")
    assert [(d.device, d.share_id) for d in first.devices] == [("w0", "s-1")]
    assert [(d.device, d.share_id) for d in second.devices] == [("w0", "s-2")]
    # The hooks learn the share, what it consumes, and the shares before it.
    assert plugin.seen == [
        ("u1", "s-1", {"shares": "1", "memory": "2Gi"}, ()),
        ("u2", "s-2", {"shares": "2", "memory": "4Gi"}, ("s-1",)),
    ]
    # One spec per claim, each naming its own share's edits.
    assert {p.name for p in w.cdi.iterdir()} == {f"k8s.{DRIVER}-claim_u1.json", f"k8s.{DRIVER}-claim_u2.json"}
    # The checkpoint records the shares and what they consume (a restart weighs them again).
    saved = json.loads((tmp_path / "checkpoint.json").read_text())["claims"]
    assert saved["u2"]["devices"][0]["shareID"] == "s-2"
    assert saved["u2"]["devices"][0]["consumedCapacity"] == {"shares": "2", "memory": "4Gi"}

    assert (await w.make().unprepare([one]))["u1"].error == ""
    assert plugin.released == []  # s-2 still uses the device
    assert (await w.make().unprepare([two]))["u2"].error == ""
    assert plugin.released == ["w0"]
    assert plugin.unprepared == ["u1", "u2"]


async def test_the_last_share_is_known_across_a_restart(tmp_path: Path) -> None:
    plugin = Sharing()
    w = World(tmp_path, plugin)
    one = w.add(shared_claim("u1", [("gpu", "w0", "s-1", {"shares": "1"})]))
    two = w.add(shared_claim("u2", [("gpu", "w0", "s-2", {"shares": "1"})]))
    await w.preparer.prepare([one, two])
    w.checkpoint.load()  # a new process: what is prepared comes from the file
    await w.make().unprepare([two])
    assert plugin.released == []
    w.checkpoint.load()
    await w.make().unprepare([one])
    assert plugin.released == ["w0"]


async def test_a_share_taken_twice_or_over_capacity_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    plugin = Sharing()
    w = World(tmp_path, plugin)
    ok = w.add(shared_claim("ok", [("gpu", "w0", "s-1", {"shares": "3"})]))
    assert (await w.preparer.prepare([ok]))["ok"].error == ""
    same = w.add(shared_claim("same", [("gpu", "w0", "s-1", {"shares": "1"})]))
    over = w.add(shared_claim("over", [("gpu", "w0", "s-2", {"shares": "2"})]))
    unknown = w.add(shared_claim("unknown", [("gpu", "w0", "s-3", {"vram": "1"})]))
    whole = w.add(shared_claim("whole", [("gpu", "w0", "", {})]))
    errors = {uid: o.error for uid, o in (await w.preparer.prepare([same, over, unknown, whole])).items()}
    assert (
        errors["same"] == "claim ns/c-same: share s-1 of device w0 is already prepared for claim ns/c-ok (ok)"
    )
    assert errors["over"] == (
        "claim ns/c-over: share s-2 of device w0 consumes 2 of shares: with its 1 other share "
        "that passes the device's 4"
    )
    assert (
        errors["unknown"] == "claim ns/c-unknown: share s-3 consumes 1 of vram, which device w0 does not have"
    )
    assert errors["whole"] == "claim ns/c-whole: device w0 is already prepared for claim ns/c-ok (ok)"
    assert set(w.checkpoint.claims) == {"ok"}
    assert [p.name for p in w.cdi.iterdir()] == [f"k8s.{DRIVER}-claim_ok.json"]
    # A share that fits is still prepared beside the first.
    fits = w.add(shared_claim("fits", [("gpu", "w0", "s-4", {"shares": "1"})]))
    assert (await w.preparer.prepare([fits]))["fits"].error == ""


async def test_an_unshared_device_is_still_given_to_one_claim(tmp_path: Path) -> None:
    w = World(tmp_path, Sharing())
    first = w.add(shared_claim("u1", [("a", "w1", "", {})]))
    other = w.add(shared_claim("u2", [("a", "w1", "s-9", {})]))
    assert (await w.preparer.prepare([first]))["u1"].error == ""
    error = (await w.preparer.prepare([other]))["u2"].error
    assert error == (
        "claim ns/c-u2: device w1 (share s-9; the device is not shared) is already prepared "
        "for claim ns/c-u1 (u1)"
    )


async def test_a_device_given_whole_keeps_shares_out(tmp_path: Path) -> None:
    w = World(tmp_path, Sharing())
    whole = w.add(shared_claim("u1", [("a", "w0", "", {})]))
    share = w.add(shared_claim("u2", [("a", "w0", "s-1", {"shares": "1"})]))
    assert (await w.preparer.prepare([whole]))["u1"].error == ""
    error = (await w.preparer.prepare([share]))["u2"].error
    assert error == "claim ns/c-u2: device w0 is already prepared whole for claim ns/c-u1 (u1)"


async def test_two_shares_of_one_device_in_one_claim(tmp_path: Path) -> None:
    plugin = Sharing()
    w = World(tmp_path, plugin)
    ref = w.add(
        shared_claim("u1", [("a", "w0", "s-1", {"shares": "2"}), ("b", "w0", "s-2", {"shares": "2"})])
    )
    outcome = (await w.preparer.prepare([ref]))["u1"]
    assert outcome.error == ""
    assert [(d.device, d.requests, d.share_id) for d in outcome.devices] == [
        ("w0", ("a",), "s-1"),
        ("w0", ("b",), "s-2"),
    ]
    # Its own shares count against the capacity: a third would not fit.
    over = w.add(
        shared_claim("u2", [("a", "w0", "s-3", {"shares": "3"}), ("b", "w0", "s-4", {"shares": "2"})])
    )
    error = (await w.preparer.prepare([over]))["u2"].error
    assert "share s-3 of device w0 consumes 3 of shares: with its 2 other shares" in error
    await w.make().unprepare([ref])
    assert plugin.released == ["w0"]


async def test_a_claim_prepared_again_with_shares_the_checkpoint_does_not_know_is_refused(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, Sharing())
    ref = w.add(shared_claim("u1", [("a", "w0", "s-1", {"shares": "1"})]))
    first = (await w.preparer.prepare([ref]))["u1"]
    assert first.error == ""
    assert (await w.preparer.prepare([ref]))["u1"].devices == first.devices  # the same answer again
    w.add(shared_claim("u1", [("a", "w0", "s-7", {"shares": "1"})]))  # allocated anew meanwhile
    error = (await w.preparer.prepare([ref]))["u1"].error
    assert error == (
        "claim ns/c-u1: its allocation names share s-7 of device w0, which the checkpoint does not "
        "record for it (it holds w0 share s-1); unprepare the claim before it is prepared with other shares"
    )
    assert w.checkpoint.claims["u1"].devices == first.devices  # nothing lost


class Answering(Sharing):
    """Answers for its devices itself, naming the share of each (or not, with ``name_share``)."""

    name_share = True

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        return [
            PreparedDevice(
                name=d.name,
                cdi_devices=(f"example.com/widget={d.share_id}",),
                share_id=d.share_id if self.name_share else None,
            )
            for d in devices
        ]


async def test_a_hook_answering_for_two_shares_of_one_device_names_each(tmp_path: Path) -> None:
    plugin = Answering()
    w = World(tmp_path, plugin)
    two = [("a", "w0", "s-1", {"shares": "1"}), ("b", "w0", "s-2", {"shares": "1"})]
    ok = (await w.preparer.prepare([w.add(shared_claim("u1", two))]))["u1"]
    assert [(d.share_id, d.cdi_device_ids) for d in ok.devices] == [
        ("s-1", ("example.com/widget=s-1",)),
        ("s-2", ("example.com/widget=s-2",)),
    ]
    plugin.name_share = False
    two = [("a", "w0", "s-3", {"shares": "1"}), ("b", "w0", "s-4", {"shares": "1"})]
    error = (await w.preparer.prepare([w.add(shared_claim("u2", two))]))["u2"].error
    assert error == (
        "prepare_claim returned device w0 without its share_id, and the claim has 2 shares of it: "
        "say which one each answer is for"
    )
    assert plugin.unprepared == ["u2"]  # the failed prepare was undone
    assert set(w.checkpoint.claims) == {"u1"}


async def test_a_failed_release_fails_the_unprepare_and_keeps_the_claim(tmp_path: Path) -> None:
    class Stuck(Sharing):
        async def release_device(self, name: str) -> None:
            raise RuntimeError(f"cannot reset {name}")

    w = World(tmp_path, Stuck())
    ref = w.add(shared_claim("u1", [("a", "w0", "s-1", {"shares": "1"})]))
    await w.preparer.prepare([ref])
    error = (await w.make().unprepare([ref]))["u1"].error
    assert error == "unprepare of claim ns/c-u1 failed: cannot reset w0"
    assert set(w.checkpoint.claims) == {"u1"}  # the kubelet retries; nothing forgotten
