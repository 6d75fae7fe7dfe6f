"""A DevicePlugin served as a DRA driver, against FakeKubeAPI over HTTP and gRPC on unix sockets."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import Device, Health
from devplug._dra.names import device_name
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving, get_info, health_stream, notify, prepare, unprepare
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"


@pytest.fixture
async def api() -> FakeKubeAPI:
    async with FakeKubeAPI() as server:
        server.add_node(NODE)
        yield server


def published(api: FakeKubeAPI) -> list[str]:
    return sorted(d["name"] for s in api.slices(node=NODE, driver=DRIVER) for d in s["spec"]["devices"])


async def test_slices_registration_and_a_claim(api: FakeKubeAPI, short_dir: Path) -> None:
    plugin = Widgets(devices=[Device(id="w0", numa_node=0, attributes={"model": "w1"}), Device(id="w_1")])
    async with driving([plugin], api, short_dir) as driver:
        await wait_until(lambda: len(published(api)) == 2)
        (slice_,) = api.slices(node=NODE, driver=DRIVER)
        spec = slice_["spec"]
        assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert spec["nodeName"] == NODE
        owner = slice_["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", NODE, True)
        devices = {d["name"]: d for d in spec["devices"]}
        assert devices["w0"]["attributes"]["numaNode"] == {"int": 0}
        assert devices["w0"]["attributes"]["model"] == {"string": "w1"}
        assert devices[device_name("w_1")]["attributes"]["id"] == {"string": "w_1"}

        info = await get_info(driver.registration_socket)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(driver.dra_socket)
        assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        assert driver.readiness()[0] is False  # the kubelet has not said yes yet
        await notify(driver.registration_socket)
        await wait_until(lambda: driver.readiness()[0])

        api.add_claim("ns", "c1", requests=[("w", 1)])
        claim = api.allocate_claim("ns", "c1", node=NODE, driver=DRIVER, devices=["w0"])
        uid = claim["metadata"]["uid"]
        for version in ("v1", "v1beta1"):
            answer = (await prepare(driver.dra_socket, ("ns", "c1", uid), version=version))[uid]
            assert answer.error == ""
            (device,) = answer.devices
            assert (device.pool_name, device.device_name, list(device.request_names)) == (NODE, "w0", ["w"])
            assert device.cdi_device_ids[0] == f"k8s.{DRIVER}/claim={uid}-w"
        spec_file = short_dir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json"
        assert json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["env"] == ["WIDGETS=w0"]
        assert plugin.allocations == [["w0"]]
        assert (await unprepare(driver.dra_socket, ("ns", "c1", uid)))[uid].error == ""
        assert not spec_file.exists()
        assert await prepare(driver.dra_socket) == {}  # an empty request is answered (liveness probes)


async def test_slices_come_back_after_a_wipe(api: FakeKubeAPI, short_dir: Path) -> None:
    async with driving([Widgets()], api, short_dir):
        await wait_until(lambda: len(published(api)) == 4)
        generation = api.slices(node=NODE)[0]["spec"]["pool"]["generation"]
        for _ in range(3):
            api.wipe_slices(NODE)
            started = time.monotonic()
            await wait_until(lambda: len(published(api)) == 4, timeout=1.0)
            assert time.monotonic() - started < 1.0
            (slice_,) = api.slices(node=NODE)
            assert slice_["spec"]["pool"]["generation"] > generation  # never back to an older one
            generation = slice_["spec"]["pool"]["generation"]


async def test_health_taints_and_the_health_stream(api: FakeKubeAPI, short_dir: Path) -> None:
    plugin = Widgets()
    async with driving([plugin], api, short_dir) as driver, health_stream(driver.dra_socket) as stream:
        first = await stream.read()
        assert sorted(d.device.device_name for d in first.devices) == ["w0", "w1", "w2", "w3"]
        assert {d.health for d in first.devices} == {1}  # HEALTHY
        assert all(d.device.pool_name == NODE and d.health_check_timeout_seconds > 0 for d in first.devices)
        plugin.set_health("w2", Health.UNHEALTHY)
        with anyio.fail_after(2):
            changed = await stream.read()
        assert {d.device.device_name: d.health for d in changed.devices}["w2"] == 2  # UNHEALTHY

        def taints() -> list[object]:
            return [
                d.get("taints")
                for s in api.slices(node=NODE)
                for d in s["spec"]["devices"]
                if d["name"] == "w2"
            ]

        await wait_until(lambda: taints() == [[{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}]])
        api.add_claim("ns", "c", requests=[("w", 4)])
        with pytest.raises(Exception, match=r"w2|enough|cannot"):
            api.allocate_claim("ns", "c", node=NODE, driver=DRIVER, count=4)  # w2 is tainted


async def test_each_unhealthy_device_is_sent_with_a_message_saying_why(
    api: FakeKubeAPI, short_dir: Path
) -> None:
    plugin = Widgets()
    async with driving([plugin], api, short_dir) as driver, health_stream(driver.dra_socket) as stream:
        first = await stream.read()
        assert {d.device.device_name: d.message for d in first.devices} == dict.fromkeys(
            ["w0", "w1", "w2", "w3"], ""
        )
        long = "température " * 100  # 1300 bytes of UTF-8, the cut falling inside an "é"
        devices = {d.id: d for d in plugin.devices}
        devices["w1"] = devices["w1"].with_health(Health.UNHEALTHY, "XID 79: the GPU fell off the bus")
        devices["w2"] = devices["w2"].with_health(Health.UNHEALTHY)
        devices["w3"] = devices["w3"].with_health(Health.UNHEALTHY, long)
        plugin.set_devices(list(devices.values()))
        with anyio.fail_after(2):
            changed = await stream.read()
        messages = {d.device.device_name: d.message for d in changed.devices}
        assert messages["w0"] == ""
        assert messages["w1"] == "XID 79: the GPU fell off the bus"
        assert messages["w2"] == "reported Unhealthy by its driver, which gave no reason"
        cut = messages["w3"]
        assert cut.endswith("...") and long.startswith(cut[:-3])
        assert 1020 <= len(cut.encode()) <= 1024  # what the kubelet keeps, cut on a character boundary


async def test_without_device_taints_an_unhealthy_device_is_left_out(short_dir: Path) -> None:
    plugin = Widgets()
    async with FakeKubeAPI(device_taints=False) as api:
        api.add_node(NODE)
        with capture_logs() as logs:
            async with driving([plugin], api, short_dir):
                await wait_until(lambda: len(published(api)) == 4)
                plugin.set_health("w1", Health.UNHEALTHY)
                await wait_until(lambda: published(api) == ["w0", "w2", "w3"])
                plugin.set_health("w1", Health.HEALTHY)
                await wait_until(lambda: len(published(api)) == 4)
        assert [e for e in logs if e["event"] == "device_taints_dropped"]


async def test_an_unreachable_api_server_is_retried_and_said(api: FakeKubeAPI, short_dir: Path) -> None:
    api.outage()
    with capture_logs() as logs:
        async with driving([Widgets()], api, short_dir) as driver:
            await notify(driver.registration_socket)
            await wait_until(lambda: any(e["event"] == "api_error" for e in logs))
            ready, reasons = driver.readiness()
            assert not ready
            assert any("unreachable" in r for r in reasons), reasons
            # The kubelet can still have claims prepared that need no API (unprepare).
            assert (await unprepare(driver.dra_socket, ("ns", "x", "u-x")))["u-x"].error == ""
            api.restore()
            await wait_until(lambda: len(published(api)) == 4, timeout=10)
            await wait_until(lambda: driver.readiness()[0], timeout=5)
    errors = [e for e in logs if e["event"] == "api_error"]
    assert all({"verb", "object", "status"} <= set(e) for e in errors)


async def test_forbidden_writes_are_logged_and_retried(api: FakeKubeAPI, short_dir: Path) -> None:
    api.fail(status=403, verbs=("create",), resource="resourceslices", times=3)
    with capture_logs() as logs:
        async with driving([Widgets()], api, short_dir):
            await wait_until(lambda: len(published(api)) == 4, timeout=10)
    forbidden = [e for e in logs if e["event"] == "api_error" and e["status"] == "403"]
    assert forbidden
    assert forbidden[0]["verb"] == "create"
    assert forbidden[0]["object"].startswith("resourceslices/")


async def test_large_pools_are_split_and_kept_consistent(api: FakeKubeAPI, short_dir: Path) -> None:
    plugin = Widgets(devices=[Device(id=f"w{i}") for i in range(300)])
    async with driving([plugin], api, short_dir):
        await wait_until(lambda: len(published(api)) == 300, timeout=10)
        slices = api.slices(node=NODE)
        assert sorted(len(s["spec"]["devices"]) for s in slices) == [44, 128, 128]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
        plugin.set_devices([Device(id=f"w{i}") for i in range(100)])
        await wait_until(lambda: len(published(api)) == 100, timeout=10)
        (only,) = api.slices(node=NODE)
        assert only["spec"]["pool"]["resourceSliceCount"] == 1
