"""Claim device status (KEP-4817, GA in 1.37): what a prepare hook reports about its devices
reaches the claim's status.devices, with the right share, without holding up or failing the
prepare; it goes at unprepare; other drivers' entries are left alone; refusals are logged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from devplug import Device
from devplug.dra import (
    AllocatedDevice,
    CapacityRequestPolicy,
    Claim,
    DeviceCondition,
    DeviceStatus,
    NetworkData,
    OpaqueConfig,
    PreparedDevice,
)
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving, prepare, unprepare
from tests.support import Widgets, wait_until
from tests.testing.kubeapi.test_kubeapi_kit import raw

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"
READY = DeviceCondition(type="Ready", status="True", reason="LinkUp", message="link at 100G")


class Reporting(Widgets):
    """Reports a condition, data and network data for each device it prepares."""

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        return [
            PreparedDevice(
                name=d.name,
                cdi_devices=(f"example.com/widget={d.name}",),
                share_id=d.share_id,
                status=DeviceStatus(
                    conditions=(READY,),
                    data={"port": d.name},
                    network_data=NetworkData(
                        interface_name=f"net-{d.name}",
                        ips=("10.0.0.7/24",),
                        hardware_address="aa:bb:cc:dd:ee:ff",
                    ),
                ),
            )
            for d in devices
        ]


def status_devices(api: FakeKubeAPI, name: str = "c") -> list[dict[str, Any]]:
    return list((api.claim("ns", name).get("status") or {}).get("devices") or [])


async def serve_claim(api: FakeKubeAPI, driver: Any, **allocate: Any) -> str:
    api.add_claim("ns", "c", requests=[("gpu", 1)])
    claim = api.allocate_claim("ns", "c", node=NODE, driver=DRIVER, **allocate)
    return str(claim["metadata"]["uid"])


async def test_what_a_device_reports_reaches_the_claim_and_goes_at_unprepare(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([Reporting()], api, short_dir) as driver:
            await wait_until(lambda: api.slices(node=NODE, driver=DRIVER))
            uid = await serve_claim(api, driver)
            # Another driver's entry (written by its own controller) must stay.
            claim = api.claim("ns", "c")
            assert (await prepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
            await wait_until(lambda: len(status_devices(api)) == 1)
            (entry,) = status_devices(api)
            assert entry["driver"] == DRIVER
            assert entry["pool"] == NODE
            assert entry["device"] == claim["status"]["allocation"]["devices"]["results"][0]["device"]
            (condition,) = entry["conditions"]
            assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
                "type": "Ready",
                "status": "True",
                "reason": "LinkUp",
                "message": "link at 100G",
            }
            assert condition["lastTransitionTime"].endswith("Z")
            assert entry["data"] == {"port": entry["device"]}
            assert entry["networkData"] == {
                "interfaceName": f"net-{entry['device']}",
                "ips": ["10.0.0.7/24"],
                "hardwareAddress": "aa:bb:cc:dd:ee:ff",
            }
            # A repeated prepare (a kubelet restart) writes nothing new.
            writes = driver.status_writer.writes
            assert (await prepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
            await wait_until(lambda: driver.status_writer.pending() == 0)
            assert driver.status_writer.writes == writes
            assert (await unprepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
            await wait_until(lambda: status_devices(api) == [])


async def test_a_share_s_entry_names_its_share(short_dir: Path) -> None:
    shared = Device(
        id="w0",
        capacity={"shares": "2"},
        allow_multiple_allocations=True,
        request_policies={"shares": CapacityRequestPolicy(default="1")},
    )
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([Reporting(devices=[shared])], api, short_dir) as driver:
            await wait_until(lambda: api.slices(node=NODE, driver=DRIVER))
            uid = await serve_claim(api, driver)
            share = api.claim("ns", "c")["status"]["allocation"]["devices"]["results"][0]["shareID"]
            assert (await prepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
            await wait_until(lambda: len(status_devices(api)) == 1)
            assert status_devices(api)[0]["shareID"] == share


async def test_a_refused_write_is_retried_and_never_fails_the_prepare(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([Reporting()], api, short_dir) as driver:
            await wait_until(lambda: api.slices(node=NODE, driver=DRIVER))
            uid = await serve_claim(api, driver)
            api.fail(status=403, verbs=("patch",), resource="resourceclaims/status")
            with capture_logs() as logs:
                assert (await prepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
                await wait_until(lambda: any(e["event"] == "claim_status_failed" for e in logs))
            failed = next(e for e in logs if e["event"] == "claim_status_failed")
            assert failed["object"] == "resourceclaims/ns/c/status"
            assert (failed["verb"], failed["status"]) == ("patch", "403")
            assert 'cannot patch resource "resourceclaims/status"' in failed["error"]
            assert status_devices(api) == []
            api.clear_faults()
            await wait_until(lambda: len(status_devices(api)) == 1, timeout=10)


async def test_an_invalid_write_is_logged_once_and_dropped(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([Reporting()], api, short_dir) as driver:
            await wait_until(lambda: api.slices(node=NODE, driver=DRIVER))
            uid = await serve_claim(api, driver)
            api.fail(status=422, verbs=("patch",), resource="resourceclaims/status", message="no good")
            with capture_logs() as logs:
                assert (await prepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
                await wait_until(lambda: driver.status_writer.pending() == 0)
            refused = [e for e in logs if e["event"] == "claim_status_refused"]
            assert len(refused) == 1
            assert refused[0]["object"] == "resourceclaims/ns/c"
            assert refused[0]["status"] == 422


async def test_other_drivers_entries_stay(short_dir: Path) -> None:
    theirs = {"driver": "other.example.com", "pool": "p", "device": "d"}
    async with FakeKubeAPI() as api, raw(api.url) as http:
        api.add_node(NODE)
        async with driving([Reporting()], api, short_dir) as driver:
            await wait_until(lambda: api.slices(node=NODE, driver=DRIVER))
            claim = api.add_claim("ns", "c", requests=[("gpu", 2)])
            # Allocated by the scheduler to two drivers, the other one's entry already written.
            claim["status"] = {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "w0"},
                            {"request": "gpu", **theirs},
                        ]
                    }
                },
                "devices": [{**theirs, "data": {"mine": False}}],
            }
            answer = await http.put(
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
                content=json.dumps(claim),
                headers={"Content-Type": "application/json"},
            )
            assert answer.status_code == 200, answer.text
            uid = claim["metadata"]["uid"]
            assert (await prepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
            await wait_until(lambda: len(status_devices(api)) == 2)
            assert {d["driver"] for d in status_devices(api)} == {DRIVER, "other.example.com"}
            assert (await unprepare(driver.dra_socket, ("ns", "c", uid)))[uid].error == ""
            await wait_until(lambda: len(status_devices(api)) == 1)
            assert status_devices(api) == [{**theirs, "data": {"mine": False}}]


def test_a_status_the_api_server_would_refuse_is_refused_where_it_is_made() -> None:
    with pytest.raises(ValidationError, match="not a qualified name"):
        DeviceCondition(type="not a type", status="True", reason="R")
    with pytest.raises(ValidationError, match="condition reason"):
        DeviceCondition(type="Ready", status="True", reason="not one word")
    with pytest.raises(ValidationError, match="canonical form"):
        NetworkData(ips=("2001:db8:0::1/64",))
    with pytest.raises(ValidationError, match="prefix length"):
        NetworkData(ips=("10.0.0.7",))
    with pytest.raises(ValidationError, match="given twice"):
        DeviceStatus(conditions=(READY, READY))
    with pytest.raises(ValidationError, match="more than 10240"):
        DeviceStatus(data={"blob": "x" * 11000})
    assert json.dumps(DeviceStatus(conditions=(READY,)).as_dict("2026-01-01T00:00:00Z")) == json.dumps(
        {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "LinkUp",
                    "message": "link at 100G",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    )
