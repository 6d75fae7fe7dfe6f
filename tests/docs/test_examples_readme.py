"""examples/README.md: what it links to exists, and its blocks run as written.

The three-terminal block runs as three processes (a fake kubelet, the plugin, devplug inspect) in
a directory of the test's own; the commands meant for a node run against a FakeKubelet, found
through ``DEVPLUG_DEVICE_PLUGIN_DIR``; the YAML blocks parse, and the DaemonSet's arguments are
flags the plugin has. ``python -m pytest tests/examples`` is what this suite runs itself.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import yaml
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.docs.blocks import ROOT, blocks, environment, flags, help_text

README = ROOT / "examples" / "README.md"
BLOCKS = blocks(README)
SH = [b for b in BLOCKS if b.lang == "sh"]
YAML = [b for b in BLOCKS if b.lang == "yaml"]


def sh_block(containing: str) -> list[str]:
    found = [b for b in SH if containing in b.text]
    assert len(found) == 1, f"one sh block of examples/README.md should contain {containing!r}: {found}"
    return found[0].text.strip().splitlines()


def test_every_block_is_covered_here() -> None:
    assert [b.lang for b in BLOCKS] == ["yaml", "sh", "sh", "sh", "yaml", "sh"]


def test_the_links_lead_to_files() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert links
    missing = [link for link in links if not (README.parent / link).exists()]
    assert not missing


def test_the_test_command_names_the_examples_tests() -> None:
    assert sh_block("pytest") == ["python -m pytest tests/examples"]
    assert sorted(p.name for p in (ROOT / "tests" / "examples").glob("test_*.py")) == [
        "test_devglob.py",
        "test_devglob_dra.py",
    ]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dpx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def read_until(stream: TextReceiveStream, text: str, seen: list[str]) -> None:
    with anyio.fail_after(30):
        while text not in "".join(seen):
            seen.append(await stream.receive())


@asynccontextmanager
async def started(line: str, env: dict[str, str] | None = None) -> AsyncIterator[Process]:
    """A README line as a shell runs it, from the repository root; SIGTERM at the end, which
    must exit 0."""
    words = shlex.split(line)
    assignments = {}
    while "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the command
        name, _, value = words.pop(0).partition("=")
        assignments[name] = value
    # exec: the signal reaches the command, not the shell.
    process = await anyio.open_process(
        ["sh", "-c", f"exec {shlex.join(words)}"],
        cwd=ROOT,
        env=environment() | assignments | (env or {}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    async with process:
        try:
            yield process
        finally:
            signal_child(process, signal.SIGTERM)
            with anyio.fail_after(15):
                code = await process.wait()
            assert process.stderr is not None
            errors = (await process.stderr.receive(65536)).decode() if code else ""
            assert code == 0, f"{line} exited {code}: {errors[-2000:]}"


@pytest.mark.anyio
async def test_try_it_without_a_cluster(short_tmp: Path) -> None:
    kubelet_line, plugin_line, inspect_line = sh_block("devplug kubelet")
    dp = short_tmp / "dp"

    def local(line: str) -> str:
        return line.replace("/tmp/devglob-dp", str(dp))

    kubelet = await anyio.open_process(
        shlex.split(local(kubelet_line)), cwd=ROOT, env=environment(), stderr=subprocess.STDOUT
    )
    async with kubelet:
        assert kubelet.stdout is not None
        out = TextReceiveStream(kubelet.stdout)
        seen: list[str] = []
        await read_until(out, "Ctrl-C to stop", seen)
        async with started(local(plugin_line)):
            await read_until(out, "registered example.com/null on example.com-null-", seen)
            await read_until(out, "example.com/null: 1 device, 1 healthy", seen)
            with anyio.fail_after(60):
                result = await anyio.run_process(
                    ["sh", "-c", local(inspect_line)], check=False, cwd=ROOT, env=environment()
                )
            assert result.returncode == 0, result.stderr.decode()
            assert "devices: 1 device, 1 healthy" in result.stdout.decode()
        await read_until(out, "example.com/null: stream ended", seen)
        signal_child(kubelet, signal.SIGINT)  # Ctrl-C
        with anyio.fail_after(15):
            await read_until(out, "stopped; kubelet.sock removed", seen)
            assert await kubelet.wait() == 0, "".join(seen)
    assert list(dp.iterdir()) == []


def test_help_lists_the_plugins_options() -> None:
    (line,) = [line for block in SH for line in block.text.splitlines() if line.endswith("--help")]
    text = help_text(shlex.split(line.removesuffix(" --help")))
    for option in ("--pattern", "--resource", "--dev-root", "--device-plugin-dir"):
        assert f"{option} " in text


@pytest.mark.anyio
@pytest.mark.parametrize("containing", ["--resource example.com/serial", "devplug run devglob:DevGlob"])
async def test_the_node_commands_serve_the_kubelet(short_tmp: Path, containing: str) -> None:
    (line,) = [line for block in SH for line in block.text.splitlines() if containing in line]
    resource = shlex.split(line)[shlex.split(line).index("--resource") + 1]
    async with (
        FakeKubelet(short_tmp) as kubelet,
        started(line, {"DEVPLUG_DEVICE_PLUGIN_DIR": str(short_tmp)}),
    ):
        registration = await kubelet.wait_for_registration(resource, timeout=30)
        assert registration.endpoint.startswith(resource.replace("/", "-") + "-")
        await kubelet.wait_for_devices(resource, timeout=30)


def test_the_yaml_blocks_parse_and_name_real_flags() -> None:
    limits, daemonset = (yaml.safe_load(b.text) for b in YAML)
    assert limits == {"resources": {"limits": {"example.com/serial": 1}}}
    (container,) = daemonset["containers"]
    known = help_text(["python", str(ROOT / "examples" / "devglob" / "devglob.py")])
    missing = [f for f in flags(shlex.join(container["args"])) if f"{f} " not in known]
    assert not missing
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"device-plugins": "/var/lib/kubelet/device-plugins", "dev": "/host/dev"}
