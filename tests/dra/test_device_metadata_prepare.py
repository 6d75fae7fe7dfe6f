"""Device metadata (KEP-5304) through prepare and unprepare: the files a claim gets, their CDI
device on its answer, written again after a reboot, removed with the claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devplug import Device
from devplug._dra.claims import MetadataOptions
from tests.dra.claims_kit import DRIVER, World, claim
from tests.support import Widgets

pytestmark = pytest.mark.anyio

VERSIONS = ("v1beta1", "v1alpha1")


def world(tmp_path: Path, *, enabled: bool = True) -> World:
    plugin = Widgets(devices=[Device(id=f"w{i}", attributes={"model": "wx"}) for i in range(4)])
    return World(
        tmp_path,
        plugin,
        metadata=MetadataOptions(host_dir=tmp_path / "md", versions=VERSIONS, enabled=enabled),
    )


def documents(path: Path) -> list[dict[str, Any]]:
    """The JSON documents of a metadata file, one per version, in order."""
    decoder, text, out = json.JSONDecoder(), path.read_text(), []
    index = 0
    while index < len(text):
        document, index = decoder.raw_decode(text, index)
        out.append(document)
        while index < len(text) and text[index].isspace():
            index += 1
    return out


async def test_a_prepared_claim_gets_its_metadata_file_and_the_cdi_device_mounting_it(tmp_path: Path) -> None:
    w = world(tmp_path)
    ref = w.add(claim("u1", [("a", "w0"), ("a", "w1"), ("b", "w2")]))
    outcome = (await w.preparer.prepare([ref]))["u1"]
    assert outcome.error == ""
    file_a = tmp_path / "md" / "ns_c-u1" / "a" / "metadata.json"
    spec_a = w.cdi / f"{DRIVER}_metadata_u1_a.json"
    assert file_a.exists() and spec_a.exists()
    assert (tmp_path / "md" / "ns_c-u1" / "b" / "metadata.json").exists()
    first, second = documents(file_a)
    assert [first["apiVersion"], second["apiVersion"]] == [f"metadata.resource.k8s.io/{v}" for v in VERSIONS]
    (request,) = first["requests"]
    assert request["name"] == "a"
    assert [(d["name"], d["attributes"]["model"]) for d in request["devices"]] == [
        ("w0", {"string": "wx"}),
        ("w1", {"string": "wx"}),
    ]
    spec = json.loads(spec_a.read_text())
    (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
    assert mount["hostPath"] == str(file_a)
    assert mount["containerPath"] == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c-u1/a/{DRIVER}-metadata.json"
    )
    # The request's first device carries the metadata's CDI device, once.
    ids = [d.cdi_device_ids for d in outcome.devices]
    assert f"{DRIVER}/metadata=u1_a" in ids[0]
    assert not any("metadata" in i for i in ids[1])
    assert f"{DRIVER}/metadata=u1_b" in ids[2]

    spec_a.unlink()  # a reboot empties /var/run/cdi
    again = (await w.preparer.prepare([ref]))["u1"]
    assert again.devices == outcome.devices
    assert spec_a.exists()

    assert (await w.make().unprepare([ref]))["u1"].error == ""
    assert not (tmp_path / "md" / "ns_c-u1").exists()
    assert not list(w.cdi.iterdir())


async def test_off_by_default_and_an_unprepare_still_cleans_up_after_it_was_on(tmp_path: Path) -> None:
    off = world(tmp_path, enabled=False)
    ref = off.add(claim("u1", [("a", "w0")]))
    outcome = (await off.preparer.prepare([ref]))["u1"]
    assert not any("metadata" in i for d in outcome.devices for i in d.cdi_device_ids)
    assert not (tmp_path / "md").exists()
    await off.make().unprepare([ref])

    on = world(tmp_path)
    ref = on.add(claim("u2", [("a", "w0")]))
    await on.preparer.prepare([ref])
    assert (tmp_path / "md" / "ns_c-u2" / "a" / "metadata.json").exists()
    turned_off = world(tmp_path, enabled=False)
    turned_off.checkpoint.load()  # restarted with the option off: the checkpoint remembers
    assert (await turned_off.make().unprepare([ref]))["u2"].error == ""
    assert not (tmp_path / "md" / "ns_c-u2").exists()
    assert not list(on.cdi.iterdir())


async def test_a_claim_made_again_under_the_same_name_keeps_its_files(tmp_path: Path) -> None:
    w = world(tmp_path)
    old = w.add(claim("old", [("a", "w0")]))
    await w.preparer.prepare([old])
    renamed = claim("new", [("a", "w1")])
    renamed["metadata"]["name"] = "c-old"  # deleted and made again: same name, new UID
    new = w.add(renamed)
    assert (await w.preparer.prepare([new]))["new"].error == ""
    path = tmp_path / "md" / "ns_c-old" / "a" / "metadata.json"
    assert documents(path)[0]["metadata"]["uid"] == "new"
    assert (await w.make().unprepare([old]))["old"].error == ""
    assert documents(path)[0]["metadata"]["uid"] == "new"  # the new claim's file stays
    assert (w.cdi / f"{DRIVER}_metadata_new_a.json").exists()
    assert not (w.cdi / f"{DRIVER}_metadata_old_a.json").exists()


async def test_metadata_that_cannot_be_written_fails_the_claim_and_leaves_nothing(tmp_path: Path) -> None:
    w = world(tmp_path)
    (tmp_path / "md").write_text("a file where the directory goes")
    ref = w.add(claim("u1", [("a", "w0")]))
    error = (await w.preparer.prepare([ref]))["u1"].error
    assert error.startswith("claim ns/c-u1: cannot write the device metadata")
    assert w.checkpoint.claims == {}
    assert not w.cdi.exists() or not list(w.cdi.iterdir())
