"""``devplug inspect`` on a DRA driver's sockets, against a raw DRA driver served by the test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from anyio.abc import Process

from devplug._proto.dra.v1 import api_pb2 as v1
from devplug.testing._process import signal_child
from tests.cli.inspect.test_cli_inspect import inspect, one_line, read_line
from tests.testing.dra_driver import DRIVER, NODE, RawDraDriver

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]


@asynccontextmanager
async def watching(command: list[str]) -> AsyncIterator[Process]:
    """``command`` started; killed at the end if still running (a failed assertion must not hang)."""
    process = await anyio.open_process(command, cwd=ROOT, stderr=subprocess.DEVNULL)
    async with process:
        try:
            yield process
        finally:
            if process.returncode is None:
                signal_child(process, signal.SIGKILL)


@pytest.fixture
async def driver(short_dir: Path) -> AsyncIterator[RawDraDriver]:
    raw = RawDraDriver(short_dir / "plugins" / DRIVER, short_dir / "registry")
    await raw.start()
    yield raw
    await raw.stop()


async def test_the_registration_socket_shows_get_info(driver: RawDraDriver) -> None:
    code, out, err = await inspect(str(driver.reg_socket))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"socket: {driver.reg_socket} (DRA registration socket)"
    assert lines[1] == f"GetInfo: type DRAPlugin, name {DRIVER}, endpoint {driver.dra_socket}"
    assert lines[2] == "supported versions: v1.DRAPlugin, v1beta1.DRAPlugin, v1alpha1.DRAResourceHealth"
    assert lines[3] == "service: v1.DRAPlugin (the first the kubelet knows)"
    assert lines[4] == "empty NodePrepareResources: {}"
    # Inspecting does not register: nothing was notified.
    assert driver.statuses == []
    assert driver.calls == [("v1", "prepare", [])]


async def test_the_dra_socket_itself_as_json(driver: RawDraDriver) -> None:
    code, out, _ = await inspect(str(driver.dra_socket), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "dra-endpoint"
    assert doc["service"] == "v1.DRAPlugin"
    assert doc["empty_prepare"] == {}
    assert "info" not in doc


async def test_a_v1beta1_only_endpoint(short_dir: Path) -> None:
    raw = RawDraDriver(short_dir / "p", short_dir / "r", services=("v1beta1.DRAPlugin",), serve=("v1beta1",))
    await raw.start_dra()
    try:
        code, out, _ = await inspect(str(raw.dra_socket), "--json")
    finally:
        await raw.stop()
    assert code == 0
    assert json.loads(out)["service"] == "v1beta1.DRAPlugin"


async def test_prepare_and_unprepare(driver: RawDraDriver) -> None:
    code, out, err = await inspect(
        str(driver.reg_socket), "--prepare", "default/c1:uid-1", "--prepare", "ns2/c2:uid-2",
        "--unprepare", "default/c1:uid-1",
    )  # fmt: skip
    assert code == 0, err
    assert "NodePrepareResources(default/c1:uid-1, ns2/c2:uid-2):" in out
    assert f"  uid-1 default/c1: 1 device\n    {NODE}/dev-0 for gpu: k8s.{DRIVER}/gpu=uid-1-dev-0" in out
    assert "NodeUnprepareResources(default/c1:uid-1):\n  uid-1 default/c1: ok" in out
    assert driver.calls == [("v1", "prepare", ["uid-1", "uid-2"]), ("v1", "unprepare", ["uid-1"])]


async def test_prepare_json(driver: RawDraDriver) -> None:
    code, out, _ = await inspect(str(driver.dra_socket), "--json", "--prepare", "default/c1:uid-1")
    assert code == 0
    prepare = json.loads(out)["prepare"]
    assert prepare["claims"] == [["default", "c1", "uid-1"]]
    assert prepare["kubelet_error"] is None
    assert prepare["results"]["uid-1"]["devices"] == [
        {
            "request_names": ["gpu"],
            "pool": NODE,
            "device": "dev-0",
            "cdi_device_ids": [f"k8s.{DRIVER}/gpu=uid-1-dev-0"],
            "share_id": None,
        }
    ]


async def test_an_answer_the_kubelet_would_refuse(driver: RawDraDriver) -> None:
    async def stray(request: Any, context: Any) -> Any:
        response = v1.NodePrepareResourcesResponse()
        response.claims.get_or_create("uid-1").error = "claim not allocated"
        response.claims.get_or_create("uid-x")
        return response

    driver.prepare_handler = stray
    code, out, err = await inspect(
        str(driver.reg_socket), "--prepare", "default/c1:uid-1", "--unprepare", "a/b:c"
    )
    assert code == 1
    assert "  uid-1 default/c1: error: claim not allocated" in out
    assert "  uid-x (not asked for): 0 devices" in out
    assert one_line(err) == (
        "devplug inspect: the kubelet would fail: "
        "NodePrepareResources failed for ResourceClaim c1: claim not allocated"
    )
    assert [c[1] for c in driver.calls] == ["prepare"]  # no unprepare after a failed prepare


async def test_a_failed_call(driver: RawDraDriver) -> None:
    async def broken(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "device on fire")

    driver.unprepare_handler = broken
    code, _, err = await inspect(str(driver.reg_socket), "--unprepare", "default/c1:uid-1")
    assert code == 1
    assert one_line(err) == (
        "devplug inspect: NodeUnprepareResources: rpc error: code = Internal desc = device on fire"
    )


async def test_services_the_kubelet_does_not_know(short_dir: Path) -> None:
    raw = RawDraDriver(short_dir / "p", short_dir / "r", services=("v1alpha3.NodeService",))
    await raw.start()
    try:
        code, _, err = await inspect(str(raw.reg_socket))
    finally:
        await raw.stop()
    assert code == 1
    assert "the kubelet would refuse this driver: none of services supported by the plugin" in one_line(err)


async def test_watch_health(driver: RawDraDriver) -> None:
    command = [sys.executable, "-m", "devplug", "inspect", str(driver.reg_socket), "--watch", "--json"]
    async with watching(command) as process:
        buffer: list[str] = []
        info = json.loads(await read_line(process, buffer))
        assert (info["event"], info["health_service"]) == ("info", "v1alpha1.DRAResourceHealth")
        first = json.loads(await read_line(process, buffer))
        assert first["event"] == "health"
        assert [(d["device"], d["health"]) for d in first["devices"]] == [("dev-0", "Healthy")]
        driver.set_health([(NODE, "dev-0", 2, 0), (NODE, "dev-1", 0, 60)])
        second = json.loads(await read_line(process, buffer))
        assert [(d["device"], d["health"], d["timeout_seconds"]) for d in second["devices"]] == [
            ("dev-0", "Unhealthy", 0),
            ("dev-1", "Unknown", 60),
        ]
        signal_child(process, signal.SIGTERM)
        with anyio.fail_after(5):
            assert await process.wait() == 0


async def test_watch_text_until_the_driver_ends_the_stream(driver: RawDraDriver) -> None:
    command = [sys.executable, "-m", "devplug", "inspect", str(driver.dra_socket), "--watch"]
    async with watching(command) as process:
        buffer: list[str] = []
        lines = [await read_line(process, buffer) for _ in range(5)]
        assert lines[:3] == [
            f"socket: {driver.dra_socket} (DRA endpoint)",
            "service: v1.DRAPlugin (the newest served)",
            "health: v1alpha1.DRAResourceHealth",
        ]
        assert "message 1: 1 device, 1 healthy" in lines[3]
        assert lines[4].split() == ["DEVICE", "HEALTH", "TIMEOUT", "MESSAGE"]
        driver.end_health_streams()
        with anyio.fail_after(5):
            assert await process.wait() == 1


async def test_watch_on_an_endpoint_that_serves_v1_health_opens_v1(short_dir: Path) -> None:
    # A bare endpoint advertises nothing: v1 is tried first (the one kubelet 1.37 prefers) and
    # used when served; the test above shows the fall back to v1alpha1 where it is not.
    raw = RawDraDriver(short_dir / "p", short_dir / "r", serve=("v1", "v1-health", "v1alpha1-health"))
    await raw.start_dra()
    try:
        command = [sys.executable, "-m", "devplug", "inspect", str(raw.dra_socket), "--watch", "--json"]
        async with watching(command) as process:
            buffer: list[str] = []
            info = json.loads(await read_line(process, buffer))
            assert (info["event"], info["health_service"]) == ("info", "v1.DRAResourceHealth")
            first = json.loads(await read_line(process, buffer))
            assert [(d["device"], d["health"]) for d in first["devices"]] == [("dev-0", "Healthy")]
            assert set(raw.health_streams) == {"v1"}
            signal_child(process, signal.SIGTERM)
            with anyio.fail_after(5):
                assert await process.wait() == 0
    finally:
        await raw.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--allocate", "a"], "are device-plugin calls"),
    ],
)
async def test_device_plugin_calls_on_a_dra_socket(
    driver: RawDraDriver, args: list[str], message: str
) -> None:
    code, _, err = await inspect(str(driver.reg_socket), *args)
    assert code == 1
    assert message in one_line(err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prepare", "no-slash"], "expected NAMESPACE/NAME:UID"),
        (["--prepare", "ns/name"], "expected NAMESPACE/NAME:UID"),
        (["--prepare", "ns/c:u", "--allocate", "a"], "cannot be combined with device-plugin calls"),
        (["--watch", "--unprepare", "ns/c:u"], "--watch cannot be combined"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "inspect", "/nonexistent.sock", *args],
        capture_output=True, text=True, timeout=30, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert message in one_line(result.stderr)


async def test_watch_on_a_registration_that_advertises_no_health_says_so(short_dir: Path) -> None:
    # Kubelet 1.37 opens no health stream for such a driver; inspect says why it has none to show.
    raw = RawDraDriver(
        short_dir / "plugins" / DRIVER,
        short_dir / "registry",
        services=("v1.DRAPlugin",),
        serve=("v1", "v1alpha1-health"),
    )
    await raw.start()
    try:
        code, _, err = await inspect(str(raw.reg_socket), "--watch")
    finally:
        await raw.stop()
    assert code == 1
    assert one_line(err) == (
        f"devplug inspect: {raw.dra_socket} advertises no DRAResourceHealth service (supported "
        "versions: v1.DRAPlugin); the kubelet watches the health only of plugins that do"
    )


def test_the_health_table_has_a_holder_column_when_pod_resources_answer() -> None:
    from devplug.cli.inspect.dra import _report_json, _table
    from devplug.testing import HealthReport

    reports = (
        HealthReport("node-1", "dev-0", "Healthy"),
        HealthReport("node-1", "dev-1", "Unhealthy", timeout_seconds=5, message="fell off"),
    )
    holders = {"node-1/dev-1": "team-a/train-0 (container main)"}
    header, free, held = _table(reports, holders).splitlines()
    assert header.split() == ["DEVICE", "HEALTH", "TIMEOUT", "HOLDER", "MESSAGE"]
    assert free.split() == ["node-1/dev-0", "Healthy", "30s", "-"]
    assert held.split(None, 3) == [
        "node-1/dev-1",
        "Unhealthy",
        "5s",
        "team-a/train-0 (container main)  fell off",
    ]
    assert header.index("HOLDER") == held.index("team-a") and header.index("MESSAGE") == held.index(
        "fell off"
    )
    assert [line.split()[0] for line in _table(reports).splitlines()] == [
        "DEVICE",
        "node-1/dev-0",
        "node-1/dev-1",
    ]
    assert "HOLDER" not in _table(reports)
    assert _report_json(reports[1], holders)["holder"] == "team-a/train-0 (container main)"
    assert _report_json(reports[0], holders)["holder"] is None
    assert "holder" not in _report_json(reports[0])
