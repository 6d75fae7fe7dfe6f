"""The devglob example, unchanged, served as a DRA driver: slices, a prepared claim, health.

The testing kit's FakeKubeAPI (a fake API server over HTTP) and serving_dra; the kubelet's
NodePrepareResources call is made over the driver's socket.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from devglob import DevGlob

from devplug.testing import FakeKubeAPI, serving_dra
from tests.dra.dra_kit import prepare

pytestmark = pytest.mark.anyio

DRIVER = "serial.example.com"
NODE = "node-1"


def make_node(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        path.symlink_to("/dev/null")


async def test_devglob_as_a_dra_driver(tmp_path: Path, short_dir: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("ttyUSB0", "ttyUSB1"):
        make_node(dev / name)
    async with FakeKubeAPI() as api:
        plugin = DevGlob("example.com/serial", "/dev/ttyUSB*", dev)
        async with serving_dra(plugin, api, short_dir, node_name=NODE) as driver:
            slices = await api.wait_for_slices(node=NODE, driver=DRIVER, count=1)
            devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
            assert len(devices) == 2
            assert all(n.startswith("ttyusb") for n in devices)  # IDs turned into DNS labels
            ids = sorted(d["attributes"]["id"]["string"] for d in devices.values())
            assert ids == ["ttyUSB0", "ttyUSB1"]
            name = next(n for n, d in devices.items() if d["attributes"]["id"]["string"] == "ttyUSB1")
            api.add_claim("default", "serial", requests=[("port", 1)])
            claim = api.allocate_claim("default", "serial", node=NODE, driver=DRIVER, devices=[name])
            uid = claim["metadata"]["uid"]
            answer = (await prepare(driver.dra_socket, ("default", "serial", uid)))[uid]
            assert answer.error == ""
            spec = json.loads((short_dir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json").read_text())
            nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
            # The node as the host has it (dev stands in for the host's /dev while scanning).
            assert [(n["path"], n.get("hostPath", n["path"])) for n in nodes] == [
                ("/dev/ttyUSB1", "/dev/ttyUSB1")
            ]
            assert spec["devices"][0]["containerEdits"]["env"] == ["DEVGLOB_DEVICES=/dev/ttyUSB1"]
            (dev / "ttyUSB0").unlink()
            await api.wait_for_slices(
                node=NODE, driver=DRIVER, predicate=lambda s: sum(len(x["spec"]["devices"]) for x in s) == 1
            )
