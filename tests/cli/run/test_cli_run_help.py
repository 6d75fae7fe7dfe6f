"""``devplug run`` as a process: help without a target, ``--version`` on every command, word
placeholders, the version in the start event, and one line for a plugin class that cannot be built."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import anyio
import pytest

from devplug.settings import GROUPS
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child

ROOT = Path(__file__).resolve().parents[3]
VERSION = version("devplug")
DEVPLUG = [sys.executable, "-m", "devplug"]
NVIDIA = [sys.executable, "-m", "devplug_nvidia"]
FAKE = [sys.executable, "-m", "devplug_fake"]


def run(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_help_without_a_target(flag: str) -> None:
    result = run([*DEVPLUG, "run", flag])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: devplug run MODULE:CLASS [OPTIONS]")
    assert "--device-plugin-dir DIR" in result.stdout
    assert "required" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        ([*DEVPLUG, "--version"], "devplug"),
        ([*DEVPLUG, "run", "--version"], "devplug run"),
        ([*DEVPLUG, "run", "devplug_fake:FakePlugin", "--version"], "devplug run"),
        ([*DEVPLUG, "demo", "--version"], "devplug demo"),
        ([*DEVPLUG, "inspect", "--version"], "devplug inspect"),
        ([*DEVPLUG, "conformance", "--version"], "devplug conformance"),
        ([*DEVPLUG, "kubelet", "--version"], "devplug kubelet"),
        ([*FAKE, "--version"], "devplug-fake"),
        ([*NVIDIA, "--version"], "devplug-nvidia"),
        ([*NVIDIA, "labels", "--version"], "devplug-nvidia labels"),
        ([*NVIDIA, "fake-root", "--version"], "devplug-nvidia fake-root"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_every_command_has_version(argv: list[str], prog: str) -> None:
    result = run(argv)
    assert (result.returncode, result.stdout) == (0, f"{prog} {VERSION}\n"), result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        [*DEVPLUG, "run", "examples.devglob.devglob:DevGlob", "--help"],
        [*FAKE, "--help"],
        [*NVIDIA, "--help"],
    ],
    ids=["devplug-run", "devplug-fake", "devplug-nvidia"],
)
def test_help_placeholders_are_words(argv: list[str]) -> None:
    text = run(argv).stdout
    for placeholder in ("--device-plugin-dir DIR", "--register-timeout SECONDS", "--config FILE"):
        assert placeholder in text
    assert "--metrics-address HOST:PORT" in text
    assert "--version" in text
    for generated in ("{Path", "null}", "tuple[", " Path", " float", " str]", " int]", "default factory"):
        assert generated not in text, f"{generated!r} in {argv[-2:]} help"
    # The runner's options in a section per group, after the command's own.
    assert re.findall(r"^(\w+) options:$", text, re.MULTILINE) == list(GROUPS)


BIN = Path(sys.executable).parent


def help_entries(text: str) -> dict[str, str]:
    """Each option of a --help text and its help, joined onto one line."""
    entries: dict[str, str] = {}
    option = None
    for line in text.splitlines():
        found = re.match(r"^  (-\S+(?:, -\S+)?)(?: \S+)*?(?:  +(.*))?$", line)
        if found and not line.startswith("   "):
            option = found.group(1)
            entries[option] = found.group(2) or ""
        elif option is not None and line.startswith("    "):
            entries[option] += " " + line.strip()
        else:
            option = None
    return entries


@pytest.mark.parametrize(
    "argv",
    [
        [str(BIN / "devplug"), "run", "--help"],
        [str(BIN / "devplug"), "run", "examples.devglob.devglob:DevGlob", "--help"],
        [str(BIN / "devplug-fake"), "--help"],
        [str(BIN / "devplug-nvidia"), "--help"],
    ],
    ids=["devplug-run", "devplug-run-devglob", "devplug-fake", "devplug-nvidia"],
)
def test_help_shows_each_default_once_in_words(argv: list[str]) -> None:
    """No default that names a Python function, no null/None/{} for "unset", and no option whose
    text says its default and then gets pydantic-settings' "(default: ...)" as well."""
    result = run(argv)
    assert result.returncode == 0, result.stderr
    entries = help_entries(result.stdout)
    assert "--device-plugin-dir" in entries and "--health" in entries, entries
    for option, text in entries.items():
        for generated in ("default factory", "<lambda>", "(default: null)", "(default: None)"):
            assert generated not in text, f"{option}: {text}"
        for empty in ("(default: {})", "(default: ())", "(default: [])"):
            assert empty not in text, f"{option}: {text}"
        assert len(re.findall(r"\bdefault:", text, re.IGNORECASE)) <= 1, f"{option}: {text}"


def test_nvidia_help_names_the_subcommands() -> None:
    text = run([*NVIDIA, "--help"]).stdout
    assert "devplug-nvidia labels [OPTIONS]" in text
    assert "--fake-nvml MODEL" in text
    assert "--device-list-strategy STRATEGY[,STRATEGY]" in text


# -- plugin classes that cannot be built ------------------------------------------------------------

PLUGINS = """
import devplug

class NoAllocate(devplug.DevicePlugin):
    resource_name = "example.com/x"

    async def watch_devices(self):
        yield []

class NeedsArguments(devplug.DevicePlugin):
    resource_name = "example.com/x"

    def __init__(self, path, count=1):
        self.path = path

    async def watch_devices(self):
        yield []

    async def allocate(self, devices):
        return devplug.ContainerAllocation()

class BuildsItself(NeedsArguments):
    @classmethod
    def from_settings(cls, settings):
        return cls("/dev/x")
"""


@pytest.fixture
def plugins() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpc-", dir="/tmp"))
    (path / "plugins.py").write_text(textwrap.dedent(PLUGINS))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("plugins:NoAllocate", "NoAllocate does not define allocate; add async def allocate(...)"),
        ("plugins:NeedsArguments", "NeedsArguments() needs path; give it a default, or define from_settings"),
    ],
)
def test_a_class_that_cannot_be_built_is_one_line(plugins: Path, target: str, says: str) -> None:
    result = run([*DEVPLUG, "run", target, "--device-plugin-dir", str(plugins / "dp")], cwd=plugins)
    assert result.returncode == 2
    assert result.stderr.startswith(f"devplug run: {target} cannot be built: {says}")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_a_class_with_from_settings_may_need_arguments(plugins: Path) -> None:
    result = run([*DEVPLUG, "run", "plugins:BuildsItself", "--help"], cwd=plugins)
    assert result.returncode == 0, result.stderr


# -- the version in the start event ------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_started_event_carries_the_version(short_dir: Path) -> None:
    dp = short_dir / "dp"
    argv = [*FAKE, "--device-plugin-dir", str(dp), "--log-format", "json"]
    async with FakeKubelet(dp) as kubelet:
        process = await anyio.open_process(argv, cwd=ROOT)
        async with process:
            await kubelet.wait_for_registration("example.com/fake", timeout=30)
            signal_child(process, signal.SIGTERM)
            with anyio.fail_after(15):
                assert await process.wait() == 0
            assert process.stderr is not None
            chunks = [chunk async for chunk in process.stderr]
            lines = b"".join(chunks).decode().splitlines()
    started = [json.loads(line) for line in lines if '"started"' in line]
    assert started, lines
    assert started[0]["version"] == VERSION


@pytest.mark.anyio
async def test_the_dra_started_event_carries_the_version(short_dir: Path) -> None:
    from devplug.testing import FakeKubeAPI
    from tests.metrics.probing import plugin

    root = short_dir / "k"
    (root / "plugins_registry").mkdir(parents=True)  # the kubelet's plugin watcher makes it
    log = short_dir / "driver.log"
    async with FakeKubeAPI() as api:
        api.add_node("node-a")
        kubeconfig = api.write_kubeconfig(short_dir / "kc")
        argv = ["--api", "dra", "--node-name", "node-a", "--kubeconfig", str(kubeconfig)]
        argv += ["--kubelet-root", str(root), "--cdi-dir", str(short_dir / "cdi")]
        async with plugin(log, "devplug_fake", *argv):
            await api.wait_for_slices(node="node-a", count=1, timeout=30)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    started = [e for e in events if e["event"] == "started"]
    assert len(started) == 1, events
    assert started[0]["version"] == VERSION
    assert started[0]["dra_socket"].startswith(str(root / "plugins"))
