"""The README's code blocks, run as a user would run them.

The python blocks are saved under the names they start with (``# serialports.py``) in a fresh
directory; the plugin runs there with ``devplug run`` and ``python serialports.py`` against a
FakeKubelet, the test block runs under ``pytest -q``, the three-terminal block runs as three
processes, and the DRA command's flags are checked against ``--help``. The two install commands
cannot run here (pip, a network): they are checked against ``.ci/run``, which runs them, and the
demo they end with runs as a process.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.docs.blocks import ROOT, Block, blocks, command, environment, flags, help_text

README = blocks(ROOT / "README.md")
PYTHON = [b for b in README if b.lang == "python"]
SH = [b for b in README if b.lang == "sh"]
RESOURCE = "example.com/serial"


def sh_block(containing: str) -> Block:
    found = [b for b in SH if containing in b.text]
    assert len(found) == 1, f"one sh block of the README should contain {containing!r}: {found}"
    return found[0]


def test_every_block_is_covered_here() -> None:
    """A new block in the README needs a test here: the ones below are all there are."""
    assert [b.file_name for b in PYTHON] == ["serialports.py", "test_serialports.py", "conftest.py"]
    # the four blocks of "Try it on a real local node" run in tests/e2e/test_readme_node.py
    assert len(SH) == 8
    assert {b.lang for b in README} == {"python", "sh"}


@pytest.fixture
def project() -> Iterator[Path]:
    """A short directory holding the README's python blocks, as the files they name."""
    path = Path(tempfile.mkdtemp(prefix="dpr-", dir="/tmp"))
    for block in PYTHON:
        assert block.file_name, f"{block}: a python block starts with the file it is saved as"
        (path / block.file_name).write_text(block.text)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- install and demo ----------------------------------------------------------------------------


def test_the_install_commands_are_the_ones_ci_runs() -> None:
    install, test = SH[0].text.strip(), SH[1].text.strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci  # verbatim: CI runs the README's test command
    # The first differs only in the extra and in what it runs after installing.
    venv, pip, demo = (part.strip() for part in install.split("&&"))
    with_dev = pip.replace(" -e .", ' -e ".[dev]"')
    assert f"{venv} && {with_dev} &&" in ci
    assert demo == ".venv/bin/devplug demo"


def test_the_demo_runs_to_completion() -> None:
    result = subprocess.run(
        [*command("devplug"), "demo"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "registered" in result.stdout + result.stderr


# -- the plugin and its test ---------------------------------------------------------------------


@asynccontextmanager
async def started(argv: list[str], cwd: Path) -> AsyncIterator[Process]:
    """``argv`` as a process in ``cwd``; SIGTERM at the end, which must exit 0."""
    process = await anyio.open_process(
        argv, cwd=cwd, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    async with process:
        try:
            yield process
        finally:
            if process.returncode is None:
                signal_child(process, signal.SIGTERM)
            with anyio.fail_after(15):
                code = await process.wait()
            assert process.stderr is not None
            errors = (await process.stderr.receive(65536)).decode() if code else ""
            assert code == 0, f"{shlex.join(argv)} exited {code}: {errors[-2000:]}"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "argv",
    [
        [*command("devplug"), "run", "serialports:SerialPorts"],
        [sys.executable, "serialports.py"],
    ],
    ids=["devplug-run", "python-file"],
)
async def test_the_plugin_registers_from_its_directory(project: Path, argv: list[str]) -> None:
    dp = project / "dp"
    async with FakeKubelet(dp) as kubelet, started([*argv, "--device-plugin-dir", str(dp)], project):
        registration = await kubelet.wait_for_registration(RESOURCE, timeout=30)
        assert registration.endpoint.startswith("example.com-serial-")
        await kubelet.wait_for_devices(RESOURCE, timeout=30)  # a list, empty without /dev/ttyUSB*
    assert sorted(p.name for p in dp.iterdir() if p.is_socket()) == []  # its socket removed


def test_importing_the_plugin_runs_nothing(project: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import serialports; print(serialports.SerialPorts.resource_name)"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
        env=environment(),
    )
    assert (result.returncode, result.stdout) == (0, f"{RESOURCE}\n"), result.stderr


def pytest_in(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=directory,
        env=environment(),
    )


def test_the_test_block_passes_under_pytest(project: Path) -> None:
    result = pytest_in(project)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout


def test_without_the_conftest_block_the_failure_names_the_fix(project: Path) -> None:
    (project / "conftest.py").unlink()
    result = pytest_in(project)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "needs a session-scoped anyio_backend" in result.stdout
    assert '@pytest.fixture(scope="session")' in result.stdout
    assert "ScopeMismatch" not in result.stdout


# -- a fake kubelet, the plugin and inspect, in three terminals ------------------------------------


async def read_until(stream: TextReceiveStream, text: str, seen: list[str]) -> None:
    with anyio.fail_after(30):
        while text not in "".join(seen):
            seen.append(await stream.receive())


@pytest.mark.anyio
async def test_three_terminals(project: Path) -> None:
    kubelet_line, run_line, inspect_line = sh_block("devplug kubelet").text.strip().splitlines()
    dp = project / "dp"

    def local(line: str) -> str:
        return line.replace("/tmp/dp", str(dp))

    kubelet = await anyio.open_process(
        shlex.split(local(kubelet_line)), cwd=project, env=environment(), stderr=subprocess.STDOUT
    )
    async with kubelet:
        assert kubelet.stdout is not None
        out = TextReceiveStream(kubelet.stdout)
        seen: list[str] = []
        await read_until(out, "Ctrl-C to stop", seen)
        async with started(shlex.split(local(run_line)), project):
            await read_until(out, f"registered {RESOURCE} on example.com-serial-", seen)
            await read_until(out, f"{RESOURCE}: 0 devices", seen)  # no /dev/ttyUSB* here
            with anyio.fail_after(60):
                result = await anyio.run_process(
                    ["sh", "-c", local(inspect_line)],  # the shell expands the socket's glob
                    check=False,
                    cwd=project,
                    env=environment(),
                )
            stdout = result.stdout.decode()
            assert result.returncode == 0, result.stderr.decode()
            assert f"socket: {dp}/example.com-serial-" in stdout
            assert "devices: 0 devices" in stdout
        await read_until(out, f"{RESOURCE}: stream ended", seen)
        signal_child(kubelet, signal.SIGINT)  # Ctrl-C
        with anyio.fail_after(15):
            await read_until(out, "stopped; kubelet.sock removed", seen)
            assert await kubelet.wait() == 0, "".join(seen)
    assert list(dp.iterdir()) == []


# -- DRA -------------------------------------------------------------------------------------------


def test_the_dra_command_names_flags_that_exist(project: Path) -> None:
    line = sh_block("devplug run serialports:SerialPorts --api dra").text.strip()
    argv = shlex.split(line)
    assert argv[:3] == ["devplug", "run", "serialports:SerialPorts"]
    known = help_text([*command("devplug"), "run", "serialports:SerialPorts"], cwd=project)
    missing = [f for f in flags(line) if f"{f} " not in known]
    assert not missing, f"{SH[-1]}: no such flags: {missing}"
