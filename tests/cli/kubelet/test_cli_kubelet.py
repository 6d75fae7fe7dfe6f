"""``devplug kubelet`` as a process, with devplug-fake registering with it; its line formats; and
``FakeKubelet.wait_for``, which it follows the kubelet with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest
from anyio.streams.text import TextReceiveStream

from devplug import ContainerAllocation, Device, DevicePlugin, PluginOptions
from devplug.cli.kubelet.command import Table, registration_line, table_lines
from devplug.testing import FakeKubelet, Registration, serving
from devplug.testing._process import signal_child

ROOT = Path(__file__).resolve().parents[3]
RESOURCE = "example.com/fake"


def write_state(path: Path, devices: list[dict[str, object]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    os.replace(tmp, path)


def devplug_kubelet(*args: str) -> subprocess.CompletedProcess[str]:
    """``devplug kubelet ARGS`` run to its end (a refusal), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "devplug", "kubelet", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def read_until(stream: TextReceiveStream, text: str, seen: list[str]) -> str:
    """Read until ``text`` has appeared; the output after it is kept for the next wait."""
    with anyio.fail_after(30):
        while text not in seen[0]:
            seen[0] += await stream.receive()
    before, _, after = seen[0].partition(text)
    seen[0] = after
    return before + text


@pytest.mark.anyio
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_kubelet_prints_what_it_learns(short_dir: Path, stop: signal.Signals) -> None:
    dp, registry = short_dir / "dp", short_dir / "reg"
    state = short_dir / "devices.json"
    write_state(state, [{"id": "fake-0", "numa_node": 0}, {"id": "fake-1"}])
    kubelet = await anyio.open_process(
        [sys.executable, "-m", "devplug", "kubelet", "--dir", str(dp), "--watcher-dir", str(registry)],
        cwd=ROOT,
        stderr=subprocess.STDOUT,
    )
    async with kubelet:
        assert kubelet.stdout is not None
        out = TextReceiveStream(kubelet.stdout)
        seen = [""]
        await read_until(out, f"kubelet serving {dp}/kubelet.sock", seen)
        await read_until(out, f"plugin watcher on {registry}", seen)
        await read_until(out, "Ctrl-C to stop\n", seen)
        fake = await anyio.open_process(
            [sys.executable, "-m", "devplug_fake", f"--device-plugin-dir={dp}", f"--state-file={state}"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        async with fake:
            await read_until(out, f"registered {RESOURCE} on example.com-fake-", seen)
            await read_until(out, "; options: none\n", seen)
            table = await read_until(out, "  fake-1  Healthy\n", seen)
            assert table.endswith(
                f"{RESOURCE}: 2 devices, 2 healthy\n  fake-0  Healthy  numa 0\n  fake-1  Healthy\n"
            )
            # A health change is one line; a new device set is a new table.
            write_state(state, [{"id": "fake-0", "numa_node": 0}, {"id": "fake-1", "health": "Unhealthy"}])
            await read_until(out, f"{RESOURCE}: fake-1 Healthy -> Unhealthy\n", seen)
            write_state(state, [{"id": "fake-2"}])
            await read_until(out, f"{RESOURCE}: 1 device, 1 healthy\n  fake-2  Healthy\n", seen)
            signal_child(fake, signal.SIGTERM)
            with anyio.fail_after(15):
                assert await fake.wait() == 0
        await read_until(out, f"{RESOURCE}: stream ended; its devices are unhealthy", seen)
        signal_child(kubelet, stop)
        await read_until(out, "stopped; kubelet.sock removed\n", seen)
        with anyio.fail_after(15):
            assert await kubelet.wait() == 0
    assert list(dp.iterdir()) == []


def test_a_directory_too_deep_for_a_socket_is_one_line(short_dir: Path) -> None:
    deep = short_dir / ("d" * 100)
    result = devplug_kubelet("--dir", str(deep))
    assert result.returncode == 2
    assert result.stderr.startswith("devplug kubelet: error: ")
    assert result.stderr.count("\n") == 1


def test_a_directory_it_cannot_make_is_one_sentence(short_dir: Path) -> None:
    (short_dir / "file").write_text("")
    result = devplug_kubelet("--dir", str(short_dir / "file" / "dp"))
    assert result.returncode == 2
    assert (
        result.stderr
        == f"devplug kubelet: {short_dir / 'file' / 'dp'}: a part of the path is not a directory\n"
    )


def test_kubelet_needs_a_directory() -> None:
    result = devplug_kubelet()
    assert result.returncode == 2
    assert "--dir" in result.stderr


ROWS = (("a", "Healthy", (0,)), ("b", "Healthy", ()))
TABLE = ["  a  Healthy  numa 0", "  b  Healthy"]


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        (None, ("s1", True, ROWS), ["r: 2 devices, 2 healthy", *TABLE]),
        (("s1", True, ROWS), ("s1", True, ROWS), []),
        (
            ("s1", True, ROWS),
            ("s1", True, (("a", "Unhealthy", (0,)), ROWS[1])),
            ["r: a Healthy -> Unhealthy"],
        ),
        (
            ("s1", True, ROWS),
            ("s1", False, (("a", "Unhealthy", (0,)), ("b", "Unhealthy", ()))),
            ["r: stream ended; its devices are unhealthy until it registers again"],
        ),
        # A new endpoint (a re-registration) prints its whole table, even when it is the same.
        (("s1", False, ROWS), ("s2", True, ROWS), ["r: 2 devices, 2 healthy", *TABLE]),
        (None, ("s1", True, ()), ["r: 0 devices, 0 healthy"]),
        (
            ("/dp/s1", True, ROWS),
            ("/dp/s2", True, ROWS),
            ["r: s1 replaced by s2; its stream closed", "r: 2 devices, 2 healthy", *TABLE],
        ),
    ],
    ids=["first", "unchanged", "health", "stream-ended", "new-endpoint", "empty", "replaced"],
)
def test_table_lines(before: Table | None, after: Table, lines: list[str]) -> None:
    assert table_lines("r", before, after) == lines


class One(DevicePlugin):
    resource_name = "example.com/one"

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        yield [Device(id="d0")]
        await anyio.sleep_forever()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation()


@pytest.mark.anyio
async def test_wait_for_rechecks_on_every_change(short_dir: Path) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        # Already true: returns at once, with the check's value.
        assert await kubelet.wait_for(lambda: "now", timeout=1) == "now"
        with pytest.raises(TimeoutError):
            await kubelet.wait_for(lambda: None, timeout=0.05)
        async with serving(One(), kubelet):
            # Registration, connection and the first list are changes: the check sees the table.
            view = await kubelet.wait_for(lambda: kubelet.resources.get("example.com/one"), timeout=30)
            devices = await kubelet.wait_for(lambda: view.devices or None, timeout=30)
            assert [d.id for d in devices] == ["d0"]


@pytest.mark.parametrize(
    ("registration", "line"),
    [
        (
            Registration("example.com/a", "a.sock", "v1beta1", PluginOptions(), True, None, "register"),
            "registered example.com/a on a.sock; options: none",
        ),
        (
            Registration(
                "example.com/a",
                "/dp/a.sock",
                "v1beta1",
                PluginOptions(get_preferred_allocation_available=True, pre_start_required=True),
                True,
                None,
                "watcher",
            ),
            "registered example.com/a (plugin watcher) on a.sock; options: preferred-allocation, pre-start",
        ),
        (
            Registration(
                "bad",
                "b.sock",
                "v1beta1",
                PluginOptions(),
                False,
                'the ResourceName "bad" is invalid',
                "register",
            ),
            'refused bad: the ResourceName "bad" is invalid',
        ),
    ],
    ids=["accepted", "watcher-with-options", "refused"],
)
def test_registration_line(registration: Registration, line: str) -> None:
    assert registration_line(registration, Path("/dp")) == line


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["dir", "dra"])
async def test_a_signal_while_it_starts_ends_the_start_in_one_line(short_dir: Path, mode: str) -> None:
    """SIGINT then SIGTERM as soon as main has taken the signals over, while the testing kit
    loads and the kubelet (and API server) come up: the start is abandoned, status 130 with one
    line, never a traceback, nothing left. (Such a signal used to be swallowed, or to wait until
    the kubelet was up, which then served and stopped.)"""
    from tests.chaos.signal_kit import until_main

    where = ["--dir", str(short_dir / "dp")]
    if mode == "dra":
        where = ["--dra", "--kubelet-root", str(short_dir / "k")]
    command = [sys.executable, "-m", "devplug", "kubelet", *where]
    async with await anyio.open_process(command, cwd=ROOT, stderr=subprocess.STDOUT) as process:
        try:
            await until_main(process.pid, 30)
            signal_child(process, signal.SIGINT)
            await anyio.sleep(0.005)
            signal_child(process, signal.SIGTERM)
            with anyio.fail_after(30):
                status = await process.wait()
        finally:
            if process.returncode is None:  # it served on: kill it, or leaving this block waits for ever
                signal_child(process, signal.SIGKILL)
        assert process.stdout is not None
        output = b"".join([chunk async for chunk in process.stdout]).decode()
    assert "Traceback" not in output
    assert status == 130, output
    assert output.splitlines() == ["devplug kubelet: interrupted"]
    assert not [p for p in short_dir.rglob("*") if p.is_socket() or p.name == "kubeconfig"]
