"""``devplug inspect`` as a process, against a live devplug-fake (registered with a FakeKubelet here)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.support import wait_until

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]
RESOURCE = "example.com/fake"
STATE = [
    {"id": "fake-0", "numa_node": 0},
    {"id": "fake-1", "numa_node": 1},
    {"id": "fake-2", "health": "Unhealthy"},
]


@dataclass
class Live:
    socket: Path
    state_file: Path


def write_state(path: Path, devices: list[dict[str, object]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    os.replace(tmp, path)


@asynccontextmanager
async def serving(dp: Path, command: list[str], resource: str) -> AsyncIterator[Path]:
    """``command`` registered with a FakeKubelet on ``dp``; yields its socket; SIGTERM at the end."""
    async with FakeKubelet(dp) as kubelet:
        process = await anyio.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        async with process:
            try:
                reg = await kubelet.wait_for_registration(resource, timeout=15)
                await kubelet.wait_for_devices(resource)
                yield dp / reg.endpoint
            finally:
                signal_child(process, signal.SIGTERM)
                with anyio.fail_after(5):
                    await process.wait()


@pytest.fixture(scope="module")
def module_dir() -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="dpi-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
async def live(module_dir: Path) -> AsyncIterator[Live]:
    """One devplug-fake for the whole module, its devices from a state file the tests may edit."""
    state = module_dir / "devices.json"
    write_state(state, STATE)
    command = [sys.executable, "-m", "devplug_fake", "--device-plugin-dir", str(module_dir / "dp")]
    command += ["--state-file", str(state), "--device-specs", "--cdi"]
    async with serving(module_dir / "dp", command, RESOURCE) as path:
        yield Live(path, state)


async def inspect(*args: str) -> tuple[int, str, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "devplug", "inspect", *args], check=False, cwd=ROOT
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


async def test_options_and_table(live: Live) -> None:
    code, out, err = await inspect(str(live.socket))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"socket: {live.socket}"
    assert lines[1] == "options: pre_start_required=no, get_preferred_allocation_available=no"
    assert lines[2] == "devices: 3 devices, 2 healthy"
    assert [line.split() for line in lines[3:]] == [
        ["ID", "HEALTH", "NUMA"],
        ["fake-0", "Healthy", "0"],
        ["fake-1", "Healthy", "1"],
        ["fake-2", "Unhealthy", "-"],
    ]


async def test_json_with_allocate(live: Live) -> None:
    code, out, err = await inspect(str(live.socket), "--json", "--allocate", "fake-1,fake-0")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["options"] == {"pre_start_required": False, "get_preferred_allocation_available": False}
    assert doc["devices"][1] == {"id": "fake-1", "health": "Healthy", "healthy": True, "numa_nodes": [1]}
    assert doc["devices"][2]["healthy"] is False
    (response,) = doc["allocate"]["container_responses"]
    assert response["envs"] == {"FAKE_VISIBLE_DEVICES": "fake-1,fake-0"}
    assert response["cdi_devices"] == ["example.com/fake=fake-1", "example.com/fake=fake-0"]
    assert response["devices"][0] == {
        "container_path": "/dev/fake-1",
        "host_path": "/dev/null",
        "permissions": "rw",
    }


async def test_allocate_text_and_unknown_device(live: Live) -> None:
    code, out, err = await inspect(str(live.socket), "--allocate", "fake-0")
    assert code == 0, err
    assert (
        "Allocate(fake-0):\n  env     FAKE_VISIBLE_DEVICES=fake-0\n  device  /dev/null -> /dev/fake-0 (rw)"
        in out
    )
    code, out, err = await inspect(str(live.socket), "--allocate", "nope")
    assert code == 1
    assert one_line(err).startswith("devplug inspect: Allocate failed: INVALID_ARGUMENT: unknown device IDs")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preferred", "fake-0,fake-1", "--size", "1"], "GetPreferredAllocation is not offered"),
        (["--pre-start", "fake-0"], "PreStartContainer is not offered"),
    ],
)
async def test_calls_not_offered(live: Live, args: list[str], message: str) -> None:
    code, _, err = await inspect(str(live.socket), *args)
    assert code == 1
    assert message in one_line(err)


async def test_preferred_and_pre_start_when_offered(short_dir: Path) -> None:
    # tests.support.PickyWidgets offers both, and prefers the reversed order.
    command = [sys.executable, "-m", "devplug", "run", "tests.support:PickyWidgets"]
    command += ["--device-plugin-dir", str(short_dir / "dp")]
    async with serving(short_dir / "dp", command, "example.com/widget") as path:
        code, out, err = await inspect(
            str(path),
            "--preferred",
            "w0,w1,w2,w3",
            "--must-include",
            "w0",
            "--size",
            "2",
            "--pre-start",
            "w0",
        )
        assert code == 0, err
        assert (
            "GetPreferredAllocation(size=2): w3, w0" in out or "GetPreferredAllocation(size=2): w0, w3" in out
        )
        assert "PreStartContainer(w0): ok" in out
        code, out, err = await inspect(str(path), "--json", "--preferred", "w0,w1,w2", "--size", "2")
        assert code == 0, err
        preferred = json.loads(out)["preferred"]
        assert preferred["size"] == 2 and len(preferred["chosen"]) == 2


async def read_line(process: Process, buffer: list[str]) -> str:
    """The next line of ``process``'s stdout (``buffer`` holds what was read past it)."""
    assert process.stdout is not None
    with anyio.fail_after(5):
        while "\n" not in "".join(buffer):
            buffer.append((await process.stdout.receive()).decode())
    text = "".join(buffer)
    line, rest = text.split("\n", 1)
    buffer[:] = [rest]
    return line


async def test_watch_follows_changes(live: Live) -> None:
    command = [sys.executable, "-m", "devplug", "inspect", str(live.socket), "--watch", "--json"]
    async with await anyio.open_process(command, cwd=ROOT, stderr=subprocess.DEVNULL) as process:
        buffer: list[str] = []
        assert json.loads(await read_line(process, buffer))["event"] == "options"
        first = json.loads(await read_line(process, buffer))
        assert (first["event"], first["seq"], len(first["devices"])) == ("list", 1, 3)
        write_state(live.state_file, [*STATE[:1], {"id": "fake-1", "health": "Unhealthy"}, *STATE[2:]])
        second = json.loads(await read_line(process, buffer))
        assert second["seq"] == 2
        assert [d["health"] for d in second["devices"]] == ["Healthy", "Unhealthy", "Unhealthy"]
        write_state(live.state_file, STATE)
        assert json.loads(await read_line(process, buffer))["devices"][1]["health"] == "Healthy"
        signal_child(process, signal.SIGTERM)
        with anyio.fail_after(5):
            assert await process.wait() == 0


async def test_watch_text_ends_on_ctrl_c(live: Live) -> None:
    command = [sys.executable, "-m", "devplug", "inspect", str(live.socket), "--watch"]
    async with await anyio.open_process(command, cwd=ROOT) as process:
        buffer: list[str] = []
        lines = [await read_line(process, buffer) for _ in range(4)]
        assert lines[0] == f"socket: {live.socket}"
        assert "list 1: 3 devices, 2 healthy" in lines[2]
        signal_child(process, signal.SIGINT)
        with anyio.fail_after(5):
            assert await process.wait() == 0
        assert process.stderr is not None
        err = "".join([chunk async for chunk in TextReceiveStream(process.stderr)])
        assert "Traceback" not in err


# -- what is not a device plugin ----------------------------------------------------------------


async def test_missing_path_and_regular_file(short_dir: Path) -> None:
    code, _, err = await inspect(str(short_dir / "nothing.sock"))
    assert (code, one_line(err)) == (1, f"devplug inspect: {short_dir / 'nothing.sock'}: no such file")
    regular = short_dir / "file.sock"
    regular.write_text("not a socket")
    code, _, err = await inspect(str(regular))
    assert (code, one_line(err)) == (1, f"devplug inspect: {regular}: not a socket (a regular file)")


async def test_stale_socket(short_dir: Path) -> None:
    path = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # bound, never listening: what a crashed server leaves
        code, _, err = await inspect(str(path))
    assert code == 1
    assert "nobody is listening" in one_line(err)


async def test_socket_that_does_not_speak_grpc(short_dir: Path) -> None:
    path = short_dir / "silent.sock"
    accepted: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        accepted.append(stream)  # accept, read nothing, answer nothing
        await anyio.sleep_forever()

    listener = await anyio.create_unix_listener(path)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        code, _, err = await inspect(str(path), "--timeout", "1")
        tg.cancel_scope.cancel()
    assert code == 1
    assert "no answer to GetDevicePluginOptions within 1 s" in one_line(err)


async def test_grpc_server_that_is_not_a_device_plugin(short_dir: Path) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:  # serves Registration, not DevicePlugin
        code, _, err = await inspect(str(kubelet.socket_path))
    assert code == 1
    assert "speaks gRPC but not the device plugin protocol" in one_line(err)


async def test_a_glob_that_matches_two_sockets_says_so(short_dir: Path) -> None:
    """Expanded by the shell or given quoted, a glob naming two sockets is one line naming both
    and status 2 (it used to be argparse's "unrecognized arguments" for the second)."""
    async with FakeKubelet(short_dir / "a") as one, FakeKubelet(short_dir / "b") as two:
        first, second = str(one.socket_path), str(two.socket_path)
        code, _, err = await inspect(first, second)
        assert (code, one_line(err)) == (
            2,
            "devplug inspect: error: SOCKET: 2 paths given (a glob that matched more than one?): "
            f"{first}, {second}; inspect one at a time",
        )
        pattern = str(short_dir / "?" / "kubelet.sock")
        code, _, err = await inspect(pattern)
        assert (code, one_line(err)) == (
            2,
            f"devplug inspect: error: SOCKET: {pattern} matches 2 paths: {first}, {second}; "
            "inspect one at a time",
        )
        # A quoted glob that matches one socket is that socket.
        code, _, err = await inspect(str(short_dir / "a" / "*.sock"))
    assert code == 1
    assert f"{first}: speaks gRPC but not the device plugin protocol" in one_line(err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watch", "--allocate", "a"], "--watch cannot be combined"),
        (["--must-include", "a"], "--must-include and --size go with --preferred"),
        (["--preferred", "a,b", "--must-include", "c"], "must be among --preferred's: c"),
        (["--preferred", "a,b", "--size", "3"], "--size must be"),
        (["--allocate", "a,,b"], "expected comma-separated device IDs"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "inspect", "/nonexistent.sock", *args],
        capture_output=True, text=True, timeout=30, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert message in one_line(result.stderr)


async def test_health_strings_shown_as_sent(short_dir: Path) -> None:
    # A plugin that sends "healthy": shown as sent, and read as the kubelet reads it.
    script = Path(__file__).parents[1] / "broken_plugins.py"
    env = {**os.environ, "DEVPLUG_DEVICE_PLUGIN_DIR": str(short_dir)}
    command = [sys.executable, str(script), "lowercase-health"]
    async with await anyio.open_process(command, env=env, stderr=subprocess.DEVNULL) as process:
        path = short_dir / f"broken-{process.pid}-1.sock"
        await wait_until(path.is_socket, timeout=10, interval=0.02, what=f"the socket {path.name}")
        code, out, err = await inspect(str(path))
        assert code == 0, err
        assert "devices: 3 devices, 0 healthy" in out
        assert "  b0  'healthy' (not exact: unhealthy to the kubelet)  -" in out
        code, out, err = await inspect(str(path), "--json")
        assert json.loads(out)["devices"][0] == {
            "id": "b0",
            "health": "healthy",
            "healthy": False,
            "numa_nodes": [],
        }
        signal_child(process, signal.SIGTERM)
        with anyio.fail_after(5):
            assert await process.wait() == 0
    assert not path.exists()


async def test_holder_column_from_the_kubelet_s_pod_resources(short_dir: Path) -> None:
    dp = short_dir / "dp"
    async with FakeKubelet(dp) as kubelet:
        command = [sys.executable, "-m", "devplug_fake", "--device-plugin-dir", str(dp), "--count", "3"]
        process = await anyio.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        async with process:
            try:
                reg = await kubelet.wait_for_registration(RESOURCE, timeout=15)
                await kubelet.wait_for_devices(RESOURCE)
                await kubelet.allocate(RESOURCE, ["fake-1"], pod="team-a/train-0")
                assert kubelet.pod_resources_socket is not None
                socket_path = str(dp / reg.endpoint)
                code, out, err = await inspect(
                    socket_path, "--pod-resources", str(kubelet.pod_resources_socket)
                )
                assert code == 0, err
                rows = [line.split(None, 3) for line in out.splitlines()[3:]]
                assert rows == [
                    ["ID", "HEALTH", "NUMA", "HOLDER"],
                    ["fake-0", "Healthy", "-", "-"],
                    ["fake-1", "Healthy", "-", "team-a/train-0 (container main)"],
                    ["fake-2", "Healthy", "-", "-"],
                ]
                code, out, err = await inspect(
                    socket_path, "--json", "--pod-resources", str(kubelet.pod_resources_socket)
                )
                assert code == 0, err
                holders = {d["id"]: d["holder"] for d in json.loads(out)["devices"]}
                assert holders == {
                    "fake-0": None,
                    "fake-1": "team-a/train-0 (container main)",
                    "fake-2": None,
                }
                # A socket that does not answer: the table without the column, one line on stderr.
                dead = short_dir / "dead.sock"
                dead.write_text("")
                code, out, err = await inspect(socket_path, "--pod-resources", str(dead))
                assert code == 0, err
                assert out.splitlines()[3].split() == ["ID", "HEALTH", "NUMA"]
                assert "no HOLDER column" in err
            finally:
                signal_child(process, signal.SIGTERM)
                with anyio.fail_after(5):
                    await process.wait()


def test_a_pod_resources_path_that_is_not_there_exits_2(short_dir: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug",
            "inspect",
            str(short_dir / "x.sock"),
            "--pod-resources",
            "/nonexistent/kubelet.sock",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "--pod-resources /nonexistent/kubelet.sock: no such file" in result.stderr
