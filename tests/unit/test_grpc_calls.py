"""A grpc.aio unary call cancelled by an anyio scope: the scope sees its own cancellation."""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import pytest

from devplug._grpc_calls import await_call
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("devplug", "devplug_fake", "devplug_nvidia")


class _Slow(reg_pb_grpc.RegistrationServicer):
    async def GetInfo(self, request: reg_pb.InfoRequest, context: object) -> reg_pb.PluginInfo:
        await anyio.sleep(30)
        return reg_pb.PluginInfo()


@pytest.fixture
async def stub() -> AsyncIterator[Any]:
    with tempfile.TemporaryDirectory(prefix="dpc-", dir="/tmp") as root:
        path = Path(root) / "slow.sock"
        server = grpc.aio.server()
        reg_pb_grpc.add_RegistrationServicer_to_server(_Slow(), server)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
                yield reg_pb_grpc.RegistrationStub(channel)
        finally:
            await server.stop(None)


async def _cancelled_inside_a_task_group(call: Callable[[], Awaitable[object]]) -> list[str]:
    """Cancel a scope around ``call`` once the call is under way; what the task did after it."""
    seen: list[str] = []

    async def worker() -> None:
        with anyio.move_on_after(0.3) as scope:
            await call()
        seen.append(f"after the scope, cancelled_caught={scope.cancelled_caught}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
    return seen


async def test_a_cancelled_scope_catches_its_own_cancellation_of_a_call(stub: Any) -> None:
    seen = await _cancelled_inside_a_task_group(
        lambda: await_call(stub.GetInfo(reg_pb.InfoRequest(), timeout=10))
    )
    assert seen == ["after the scope, cancelled_caught=True"]


async def test_grpc_alone_lets_the_cancellation_through_the_scope(stub: Any) -> None:
    """Why await_call exists: should grpc.aio keep anyio's cancellation one day, it can go."""
    with anyio.fail_after(5):
        seen = await _cancelled_inside_a_task_group(lambda: stub.GetInfo(reg_pb.InfoRequest(), timeout=10))
    assert seen == []


async def test_a_failed_call_raises_the_rpc_error(stub: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await await_call(stub.GetInfo(reg_pb.InfoRequest(), timeout=0.1))
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def _bare_stub_calls(path: Path) -> list[str]:
    """``await <...stub...>.Method(...)`` in ``path``: a grpc.aio call awaited without await_call."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Await) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if isinstance(func, ast.Attribute) and "stub" in ast.unparse(func.value).lower():
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_unary_call_of_the_packages_goes_through_await_call() -> None:
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "_proto" not in p.parts]
    assert files
    assert [line for path in files for line in _bare_stub_calls(path)] == []


# -- server calls left running when the event loop closes --------------------------------------

_STREAMS_LEFT_RUNNING = """
import asyncio, os, sys, tempfile
import grpc
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb, api_pb2_grpc as pb_grpc
from devplug._runtime.signals import run_async

class Streams(pb_grpc.DevicePluginServicer):
    async def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse()
        await asyncio.sleep(30)

async def main():
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "s.sock")
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(Streams(), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{path}")
    calls = [pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty()) for _ in range(3)]
    for call in calls:
        await call.read()
    await server.stop(0)  # returns with the three streams' tasks still running
    print("stopped", flush=True)

asyncio.run(main()) if sys.argv[1] == "asyncio" else run_async(main)
"""


def _streams_left_running(runner: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _STREAMS_LEFT_RUNNING, runner],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_grpc_prints_a_traceback_for_calls_the_closing_loop_cancels() -> None:
    # The canary: what settle_server_calls is there for (a stop signal as a stream opened).
    # It depends on timing: 3 runs in 4 print here, so up to 8 tries.
    for _ in range(8):
        result = _streams_left_running("asyncio")
        assert result.returncode == 0
        if "_schedule_rpc_coro" in result.stderr:
            return
    pytest.fail("grpc.aio no longer prints a traceback for a call cancelled by the loop's close")


def test_run_async_ends_the_calls_before_the_loop_closes() -> None:
    for _ in range(3):  # without settle_server_calls, 3 runs in 4 print
        result = _streams_left_running("devplug")
        assert (result.returncode, result.stdout) == (0, "stopped\n")
        assert "Traceback" not in result.stderr, result.stderr  # (its own client logs a GOAWAY)
