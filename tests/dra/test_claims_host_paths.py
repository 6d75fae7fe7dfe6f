"""The default prepare checks the host paths of what ``allocate`` returns, as the device-plugin
Allocate does: the same ``host_path_check`` and ``host_root`` settings, a per-claim error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DeviceSpec, Mount
from devplug.testing import FakeKubeAPI
from tests.dra.claims_kit import World, claim
from tests.dra.dra_kit import NODE, driving, notify, prepare
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

MISSING = "/dev/devplug-test-no-such-device"


class Elsewhere(Widgets):
    """Hands out a device node and a mount at host paths given by the test."""

    def __init__(self, device: str = MISSING, mount: str = "/devplug-test-no-such-dir") -> None:
        super().__init__()
        self.device, self.mount = device, mount

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation(
            devices=(DeviceSpec.rw(self.device, "/dev/w"),),
            mounts=(Mount(host_path=self.mount, container_path="/data"),),
        )


REFUSED = (
    f"claim ns/c-u1: allocate for ['w0']: device host path {MISSING} (for /dev/w): missing; "
    "mount host path /devplug-test-no-such-dir (for /data): missing"
)


async def test_refuse_fails_the_claim_naming_each_path(tmp_path: Path) -> None:
    w = World(tmp_path, Elsewhere(), host_path_check="refuse")
    bad = w.add(claim("u1", [("a", "w0")]))
    with capture_logs() as logs:
        result = await w.preparer.prepare([bad])
    assert result["u1"].error == REFUSED
    assert not w.checkpoint.claims
    assert not w.cdi.exists() or not list(w.cdi.iterdir())
    (refused,) = [e for e in logs if e["event"] == "allocate_refused"]
    assert refused["log_level"] == "error"
    assert refused["claim"] == "ns/c-u1"
    assert refused["error"] in REFUSED


async def test_warn_logs_each_path_and_prepares(tmp_path: Path) -> None:
    w = World(tmp_path, Elsewhere(), host_path_check="warn")
    with capture_logs() as logs:
        result = (await w.preparer.prepare([w.add(claim("u1", [("a", "w0")]))]))["u1"]
    assert result.error == ""
    assert set(w.checkpoint.claims) == {"u1"}
    warned = [e for e in logs if e["event"] == "host_path_invalid"]
    assert [(e["kind"], e["reason"], e["claim"]) for e in warned] == [
        ("device", "missing", "ns/c-u1"),
        ("mount", "missing", "ns/c-u1"),
    ]


async def test_off_checks_nothing(tmp_path: Path) -> None:
    w = World(tmp_path, Elsewhere(), host_path_check="off")
    with capture_logs() as logs:
        result = (await w.preparer.prepare([w.add(claim("u1", [("a", "w0")]))]))["u1"]
    assert result.error == ""
    assert not [e for e in logs if e["event"] in ("host_path_invalid", "allocate_refused")]


async def test_paths_are_looked_up_under_the_host_root(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "data").mkdir(parents=True)
    plugin = Elsewhere(device="/dev/null", mount="/data")  # /dev/null is not under host/
    w = World(tmp_path, plugin, host_path_check="refuse", host_root=host)
    result = (await w.preparer.prepare([w.add(claim("u1", [("a", "w0")]))]))["u1"]
    assert (
        result.error == "claim ns/c-u1: allocate for ['w0']: device host path /dev/null (for /dev/w): missing"
    )
    plugin.device = "/data"  # there now, but not a device node
    result = (await w.preparer.prepare([w.add(claim("u2", [("a", "w0")]))]))["u2"]
    assert result.error.endswith("device host path /data (for /dev/w): not a device node")


async def test_the_driver_applies_the_settings(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving(
            [Elsewhere()], api, short_dir, driver_name="widget.example.com", host_path_check="refuse"
        ) as driver:
            await notify(driver.registration_socket)
            await wait_until(lambda: driver.readiness()[0])
            api.add_claim("ns", "c-u1", requests=[("a", 1)])
            uid = api.allocate_claim("ns", "c-u1", node=NODE, driver="widget.example.com", devices=["w0"])[
                "metadata"
            ]["uid"]
            answer = (await prepare(driver.dra_socket, ("ns", "c-u1", uid)))[uid]
            assert answer.error == REFUSED
            assert not answer.devices
