"""The checkpoint's file format: typed records in memory, the same JSON on disk as every earlier
version wrote (the other pod of a rolling update reads and writes the same file)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from devplug._dra.allocation import PreparedEntry
from devplug._dra.checkpoint import FILE_NAME, Checkpoint, PreparedClaim
from devplug.dra import ClaimRef
from tests.dra.claims_kit import DRIVER, NODE, World

pytestmark = pytest.mark.anyio

KIND = f"k8s.{DRIVER}/claim"
# Two claims as version 1 wrote them before the records were typed: devices as the kubelet's
# fields in the API's spelling, ``shareID`` only when set.
CLAIMS: dict[str, Any] = {
    "u1": {
        "uid": "u1",
        "namespace": "ns",
        "name": "c-u1",
        "devices": [
            {
                "requests": ["a"],
                "pool": NODE,
                "device": "w0",
                "cdiDeviceIds": [f"{KIND}=u1-a"],
                "adminAccess": False,
            },
            {"requests": ["a"], "pool": NODE, "device": "w1", "cdiDeviceIds": [], "adminAccess": False},
        ],
        "spec_file": f"k8s.{DRIVER}-claim_u1.json",
        "spec_text": '{"cdiVersion":"0.6.0"}',
        "resources": ["example.com/widget"],
    },
    "u2": {
        "uid": "u2",
        "namespace": "ns",
        "name": "c-u2",
        "devices": [
            {
                "requests": ["b"],
                "pool": NODE,
                "device": "w2",
                "cdiDeviceIds": ["example.com/widget=w2"],
                "adminAccess": True,
                "shareID": "s-1",
            }
        ],
        "spec_file": None,
        "spec_text": None,
        "resources": ["example.com/widget"],
    },
}
RECORDS = {
    "u1": PreparedClaim(
        "u1",
        "ns",
        "c-u1",
        devices=[
            PreparedEntry(device="w0", pool=NODE, requests=("a",), cdi_device_ids=(f"{KIND}=u1-a",)),
            PreparedEntry(device="w1", pool=NODE, requests=("a",)),
        ],
        spec_file=f"k8s.{DRIVER}-claim_u1.json",
        spec_text='{"cdiVersion":"0.6.0"}',
        resources=["example.com/widget"],
    ),
    "u2": PreparedClaim(
        "u2",
        "ns",
        "c-u2",
        devices=[
            PreparedEntry(
                device="w2",
                pool=NODE,
                requests=("b",),
                cdi_device_ids=("example.com/widget=w2",),
                admin_access=True,
                share_id="s-1",
            )
        ],
        resources=["example.com/widget"],
    ),
}


def written(claims: dict[str, Any], *, indent: int | None = None) -> str:
    """A checkpoint file's text with ``claims``, its checksum computed here, not by the module."""
    body = {"kind": "DevplugDRACheckpoint", "version": 1, "driver": DRIVER, "node": NODE, "claims": claims}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    body["checksum"] = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps(body, indent=indent, sort_keys=indent is not None)


@pytest.mark.parametrize("indent", [None, 1])
def test_an_earlier_version_s_checkpoint_loads_as_records(tmp_path: Path, indent: int | None) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(written(CLAIMS, indent=indent))
    checkpoint = Checkpoint(path, DRIVER, NODE)
    checkpoint.load()
    assert checkpoint.error is None
    assert checkpoint.claims == RECORDS


def test_a_device_without_admin_access_loads_as_without(tmp_path: Path) -> None:
    entry = {"requests": ["a"], "pool": NODE, "device": "w0", "cdiDeviceIds": []}
    path = tmp_path / FILE_NAME
    path.write_text(written({"u1": {**CLAIMS["u1"], "devices": [entry]}}))
    checkpoint = Checkpoint(path, DRIVER, NODE)
    checkpoint.load()
    assert checkpoint.claims["u1"].devices == [PreparedEntry(device="w0", pool=NODE, requests=("a",))]


def test_records_are_saved_in_the_same_format(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    checkpoint = Checkpoint(path, DRIVER, NODE)
    checkpoint.claims = dict(RECORDS)
    checkpoint.save()
    assert json.loads(path.read_text()) == json.loads(written(CLAIMS))


async def test_a_driver_works_from_an_earlier_version_s_checkpoint(tmp_path: Path) -> None:
    """A prepare answers from it and an unprepare undoes it, as for one written by this version."""
    w = World(tmp_path)
    (tmp_path / FILE_NAME).write_text(written(CLAIMS))
    w.checkpoint.load()
    w.add(
        {
            "metadata": {"uid": "u1", "namespace": "ns", "name": "c-u1"},
            "status": {"allocation": {"devices": {"results": []}}},
        }
    )
    again = (await w.preparer.prepare([ClaimRef("ns", "c-u1", "u1")]))["u1"]
    assert again.error == ""
    assert again.devices == RECORDS["u1"].devices
    assert w.plugin.allocations == []  # answered from the checkpoint
    assert (w.cdi / f"k8s.{DRIVER}-claim_u1.json").read_text() == '{"cdiVersion":"0.6.0"}'  # written again
    assert (await w.preparer.unprepare([ClaimRef("ns", "c-u2", "u2")]))["u2"].error == ""
    assert json.loads((tmp_path / FILE_NAME).read_text())["claims"] == {"u1": CLAIMS["u1"]}


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ({"device": "w0"}, "claims.u1.devices is not a list"),
        (["w0"], "claims.u1.devices[0] is not an object: 'w0'"),
        ([{"pool": NODE}], "claims.u1.devices[0] has no device"),
        (
            [{"device": "w0", "pool": NODE, "adminAccess": "no"}],
            "claims.u1.devices[0].adminAccess is not true",
        ),
    ],
)
def test_a_malformed_device_makes_the_checkpoint_unusable(tmp_path: Path, devices: Any, message: str) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(written({"u1": {**CLAIMS["u1"], "devices": devices}}))
    checkpoint = Checkpoint(path, DRIVER, NODE)
    checkpoint.load()
    assert checkpoint.error is not None
    assert message in checkpoint.error
    assert "move it away" in checkpoint.error
    assert checkpoint.claims == {}
