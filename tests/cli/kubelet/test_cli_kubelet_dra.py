"""``devplug kubelet --dra`` as a process, with devplug-fake started from the command it prints;
its flags' errors; and its line formats."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from devplug.cli.kubelet.dra import (
    Health,
    Instances,
    Pool,
    complete_pool,
    dra_registration_line,
    health_lines,
    instance_lines,
    pool_lines,
)
from devplug.testing import DraRegistration
from devplug.testing._process import signal_child
from tests.cli.kubelet.test_cli_kubelet import devplug_kubelet, read_until, write_state

ROOT = Path(__file__).resolve().parents[3]
DRIVER = "fake.example.com"
NODE = "node-k"
STOPPED = "stopped; kubelet.sock removed, kubeconfig kept for the next run on this root\n"


Running = tuple[Process, TextReceiveStream, list[str], str]


@asynccontextmanager
async def kubelet_dra(root: Path, *extra: str) -> AsyncIterator[Running]:
    """``devplug kubelet --dra --kubelet-root ROOT EXTRA`` running: the process, its output (stderr
    merged), the unread rest, and what it printed up to "Ctrl-C to stop" (the commands come first,
    before anything else is said)."""
    command = [sys.executable, "-m", "devplug", "kubelet", "--dra", "--kubelet-root", str(root), *extra]
    async with await anyio.open_process(command, cwd=ROOT, stderr=subprocess.STDOUT) as kubelet:
        assert kubelet.stdout is not None
        out = TextReceiveStream(kubelet.stdout)
        seen = [""]
        head = await read_until(out, "Ctrl-C to stop\n", seen)
        yield kubelet, out, seen, head


async def read_all(stream: TextReceiveStream, texts: list[str], seen: list[str]) -> str:
    """Read until every one of ``texts`` has appeared, in any order (they come from separate
    followers); the output after the last of them is kept for the next wait."""
    with anyio.fail_after(30):
        while not all(text in seen[0] for text in texts):
            seen[0] += await stream.receive()
    end = max(seen[0].index(text) + len(text) for text in texts)
    before, seen[0] = seen[0][:end], seen[0][end:]
    return before


@pytest.mark.anyio
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_kubelet_dra_prints_what_it_learns(short_dir: Path, stop: signal.Signals) -> None:
    root = short_dir / "k"
    state = short_dir / "devices.json"
    write_state(state, [{"id": "fake-0"}, {"id": "fake-1"}])
    async with kubelet_dra(root, "--node-name", NODE) as (kubelet, out, seen, head):
        lines = head.splitlines()
        assert lines[0] == "start a DRA driver against it:"
        fake_line, run_line = lines[1].strip(), lines[2].strip()
        kubeconfig = root / "kubeconfig"
        common = [
            "--kubelet-root", str(root), "--node-name", NODE,
            "--kubeconfig", str(kubeconfig), "--cdi-dir", str(root / "cdi"),
        ]  # fmt: skip
        assert shlex.split(fake_line) == ["devplug-fake", "--api", "dra", *common]
        assert shlex.split(run_line) == ["devplug", "run", "--api", "dra", "MODULE:CLASS", *common]
        dra_socket = root / "plugins" / DRIVER / "dra.sock"
        # Which driver registers is not known yet: no driver's name in the commands.
        assert DRIVER not in head
        assert f"kubelet serving {root}/device-plugins/kubelet.sock\n" in head
        assert f"plugin watcher (DRA) on {root}/plugins_registry\n" in head
        assert kubeconfig.is_file()
        # The printed command, as a user would run it (the script's module, this interpreter).
        argv = [sys.executable, "-m", "devplug_fake", *shlex.split(fake_line)[1:], f"--state-file={state}"]
        fake = await anyio.open_process(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        async with fake:
            await read_all(
                out,
                [
                    f"registered DRA driver {DRIVER} (plugin watcher, {DRIVER}-reg.sock) on {dra_socket}; "
                    "service v1.DRAPlugin\n"
                    f"  inspect it: devplug inspect {dra_socket}\n"
                    f"  prepare a claim: devplug kubelet claim --kubelet-root {root} --driver {DRIVER} NAME "
                    "(--device DEVICE to choose)\n"
                    f"  unprepare and delete it: devplug kubelet claim --kubelet-root {root} --delete NAME\n",
                    f"{DRIVER} pool: 2 devices: fake-0, fake-1\n",
                    f"{DRIVER}: connected to {dra_socket}\n",
                    f"{DRIVER} health: 2 devices, 2 healthy\n",
                ],
                seen,
            )
            # One health change: the kubelet's health stream and the published taint, one line each.
            sick = {"id": "fake-1", "health": "Unhealthy", "health_message": "fan stopped"}
            write_state(state, [{"id": "fake-0"}, sick])
            await read_all(
                out,
                [
                    f"{DRIVER} health: {NODE}/fake-1 Healthy -> Unhealthy (fan stopped)\n",
                    f"{DRIVER} pool: fake-1 tainted {DRIVER}/unhealthy:NoSchedule\n",
                ],
                seen,
            )
            write_state(state, [{"id": "fake-0"}, {"id": "fake-1"}, {"id": "fake-2"}])
            await read_all(
                out,
                [
                    f"{DRIVER} pool: 3 devices: fake-0, fake-1, fake-2\n",
                    f"{DRIVER} pool: added fake-2\n",
                    f"{DRIVER} pool: fake-1 taint {DRIVER}/unhealthy:NoSchedule removed\n",
                    f"{DRIVER} health: {NODE}/fake-1 Unhealthy (fan stopped) -> Healthy\n",
                    f"{DRIVER} health: {NODE}/fake-2 unreported -> Healthy\n",
                ],
                seen,
            )
            signal_child(fake, signal.SIGTERM)
            with anyio.fail_after(15):
                assert await fake.wait() == 0
        await read_all(
            out,
            [
                f"{DRIVER}: {dra_socket} deregistered (its registration socket is gone); 0 left\n",
                f"{DRIVER}: no instance connected; its slices are deleted in 30 s unless one connects\n",
                f"{DRIVER} health: stream ended; the kubelet forgot its devices' health\n",
            ],
            seen,
        )
        signal_child(kubelet, stop)
        await read_until(out, STOPPED, seen)
        with anyio.fail_after(15):
            assert await kubelet.wait() == 0
    # The kubelet's directories stay, as a kubelet's do, and the kubeconfig for the next run;
    # no socket and no lock are left.
    assert sorted(p.name for p in root.rglob("*.sock")) == []
    assert kubeconfig.is_file()
    assert sorted(p.name for p in root.iterdir()) == [
        "device-plugins",
        "kubeconfig",
        "plugins",
        "plugins_registry",
        "pod-resources",  # the pod-resources API's directory, left as the kubelet leaves it
    ]
    assert list((root / "device-plugins").iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dra"], "--dra needs --kubelet-root ROOT"),
        (["--dra", "--kubelet-root", "/tmp/x", "--dir", "/tmp/d"], "--dir cannot go with --dra"),
        (
            ["--dra", "--kubelet-root", "/tmp/x", "--watcher-dir", "/tmp/w"],
            "--watcher-dir cannot go with --dra",
        ),
        (["--dir", "/tmp/d", "--kubelet-root", "/tmp/x"], "--kubelet-root and --node-name go with --dra"),
        (["--dir", "/tmp/d", "--node-name", "n"], "--kubelet-root and --node-name go with --dra"),
        (["--dra", "--kubelet-root", "/tmp/x", "--node-name", "Bad_Node"], "--node-name 'Bad_Node'"),
        ([], "the following arguments are required: --dir"),
        (["--dra", "--kubelet-root", "/tmp/" + "r" * 100], "devplug kubelet: error: "),
    ],
    ids=["no-root", "dir", "watcher-dir", "root-alone", "node-alone", "bad-node", "nothing", "too-deep"],
)
def test_flags_that_do_not_go_together_are_one_line(args: list[str], message: str) -> None:
    result = devplug_kubelet(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("devplug kubelet: error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


def registration(accepted: bool, error: str | None = None, driver: str = DRIVER) -> DraRegistration:
    return DraRegistration(
        socket=f"/k/plugins_registry/{DRIVER}-reg.sock",
        driver=driver,
        endpoint=f"/k/plugins/{DRIVER}/dra.sock" if driver else "",
        services=("v1.DRAPlugin",),
        service="v1.DRAPlugin" if accepted else None,
        accepted=accepted,
        error=error,
    )


@pytest.mark.parametrize(
    ("attempt", "line"),
    [
        (
            registration(True),
            f"registered DRA driver {DRIVER} (plugin watcher, {DRIVER}-reg.sock) on "
            f"/k/plugins/{DRIVER}/dra.sock; service v1.DRAPlugin",
        ),
        (registration(False, "taken", DRIVER), f"refused DRA plugin {DRIVER}: taken"),
        (registration(False, "no GetInfo", ""), f"refused DRA plugin {DRIVER}-reg.sock: no GetInfo"),
    ],
    ids=["accepted", "refused", "refused-before-getinfo"],
)
def test_dra_registration_line(attempt: DraRegistration, line: str) -> None:
    assert dra_registration_line(attempt) == line


TAINT = "d/unhealthy:NoSchedule"


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        (None, {"a": (), "b": ()}, ["d pool: 2 devices: a, b"]),
        ({"a": ()}, {"a": ()}, []),
        (None, {"a": (TAINT,)}, ["d pool: 1 device: a", f"d pool: a tainted {TAINT}"]),
        ({"a": ()}, {"a": (TAINT,)}, [f"d pool: a tainted {TAINT}"]),
        ({"a": (TAINT,)}, {"a": ()}, [f"d pool: a taint {TAINT} removed"]),
        (
            {"a": (), "b": ()},
            {"b": (), "c": ()},
            ["d pool: 2 devices: b, c", "d pool: added c", "d pool: removed a"],
        ),
        ({"a": ()}, None, ["d pool: deleted (no slices of the node left)"]),
        (None, None, []),
        ({"a": ()}, {}, ["d pool: 0 devices", "d pool: removed a"]),
        (
            None,
            {f"g{i:02}": () for i in range(14)},
            ["d pool: 14 devices: " + ", ".join(f"g{i:02}" for i in range(12)) + ", ... (2 more)"],
        ),
    ],
    ids=["first", "same", "first-tainted", "taint", "untaint", "changed", "deleted", "none", "empty", "many"],
)
def test_pool_lines(before: Pool | None, after: Pool | None, lines: list[str]) -> None:
    assert pool_lines("d", before, after) == lines


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        (
            {},
            {("n", "a"): "Healthy", ("n", "b"): "Unhealthy"},
            ["d health: 2 devices, 1 healthy", "d health: n/b Unhealthy"],
        ),
        ({("n", "a"): "Healthy"}, {("n", "a"): "Healthy"}, []),
        ({("n", "a"): "Healthy"}, {("n", "a"): "Unknown"}, ["d health: n/a Healthy -> Unknown"]),
        ({("n", "a"): "Healthy"}, {}, ["d health: stream ended; the kubelet forgot its devices' health"]),
        ({}, {}, []),
    ],
    ids=["first", "same", "unknown", "ended", "nothing"],
)
def test_health_lines(before: Health, after: Health, lines: list[str]) -> None:
    assert health_lines("d", before, after) == lines


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        ((), (("/s", False),), []),
        ((("/s", False),), (("/s", True),), ["d: connected to /s"]),
        (
            (("/s", True),),
            (("/s", False),),
            [
                "d: connection to /s lost",
                "d: no instance connected; its slices are deleted in 5 s unless one connects",
            ],
        ),
        (
            (("/s", True), ("/t", True)),
            (("/t", True),),
            ["d: /s deregistered (its registration socket is gone); 1 left"],
        ),
    ],
    ids=["registered", "connected", "lost", "one-of-two-gone"],
)
def test_instance_lines(before: Instances, after: Instances, lines: list[str]) -> None:
    assert instance_lines("d", before, after, wipe_delay=5) == lines


def slice_of(generation: int, count: int, *devices: dict[str, object]) -> dict[str, object]:
    spec = {"pool": {"generation": generation, "resourceSliceCount": count}, "devices": list(devices)}
    return {"spec": spec}


def test_a_pool_is_read_at_its_newest_complete_generation() -> None:
    tainted: dict[str, object] = {"name": "b", "taints": [{"key": "d/unhealthy", "effect": "NoSchedule"}]}
    # Two slices announced, one written: not complete yet (the last complete state is kept).
    assert complete_pool([slice_of(2, 2, {"name": "a"})]) is None
    # A newer generation complete: the older slice left over does not count.
    pool = complete_pool(
        [slice_of(1, 1, {"name": "old"}), slice_of(2, 2, {"name": "a"}), slice_of(2, 2, tainted)]
    )
    assert pool == {"a": (), "b": ("d/unhealthy:NoSchedule",)}


@pytest.mark.anyio
async def test_the_printed_devplug_run_line_serves_a_class_and_device_plugins_are_told_too(
    short_dir: Path,
) -> None:
    """The ``devplug run --api dra MODULE:CLASS`` line, with a class for MODULE:CLASS; the same
    class as a device plugin under ROOT/device-plugins is told as ``devplug kubelet --dir`` tells it."""
    root = short_dir / "k"
    async with kubelet_dra(root) as (kubelet, out, seen, head):
        run_line = shlex.split(head.splitlines()[2])
        assert run_line[:5] == ["devplug", "run", "--api", "dra", "MODULE:CLASS"]
        target = "tests.support:Widgets"
        drivers = [
            [sys.executable, "-m", "devplug", "run", *run_line[2:4], target, *run_line[5:]],
            [sys.executable, "-m", "devplug", "run", target, "--kubelet-root", str(root)],
        ]
        async with (
            await anyio.open_process(
                drivers[0], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ) as dra,
            await anyio.open_process(
                drivers[1], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ) as dp,
        ):
            dra_socket = root / "plugins" / "widget.example.com" / "dra.sock"
            await read_all(
                out,
                [
                    f"registered DRA driver widget.example.com (plugin watcher, widget.example.com-reg.sock) "
                    f"on {dra_socket}; service v1.DRAPlugin\n",
                    "widget.example.com pool: 4 devices: w0, w1, w2, w3\n",
                    "registered example.com/widget on example.com-widget-",
                    "example.com/widget: 4 devices, 4 healthy\n",
                ],
                seen,
            )
            for process in (dra, dp):
                signal_child(process, signal.SIGTERM)
                with anyio.fail_after(15):
                    assert await process.wait() == 0
        signal_child(kubelet, signal.SIGTERM)
        await read_until(out, STOPPED, seen)
        with anyio.fail_after(15):
            assert await kubelet.wait() == 0
    assert sorted(p.name for p in root.rglob("*.sock")) == []
