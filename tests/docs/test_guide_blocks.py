"""The code blocks of docs/*.md: every python block compiles and its imports resolve; the author
guide's plugin, conftest and test run under ``pytest -q``; the devplug commands shown name
sub-commands and flags that exist.

Executed: the author guide's ``fpga.py``, its ``conftest.py`` block, its test block (saved as
``test_fpga.py``), its conformance test (``test_conformance.py``), and the blocks it has the
reader save as ``test_*.py`` (the DRA driver's tests and conformance test). Only checked: the other
python blocks (fragments: ``...`` for methods shown earlier, names such as ``gpus()`` left to
the reader), the devplug, devplug-fake
and devplug-nvidia command lines (flags against ``--help``), and the kubectl and docker lines,
which need a cluster or a registry (the command must be one of them).
"""

from __future__ import annotations

import ast
import importlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, Block, blocks, command, environment, flags, help_text

DOCS = sorted((ROOT / "docs").glob("*.md"))
ALL = [b for path in DOCS for b in blocks(path)]
PYTHON = [b for b in ALL if b.lang == "python"]
AUTHOR = [b for b in PYTHON if b.source == "author-guide.md"]
EXTERNAL = {"kubectl", "docker"}
OURS = {"devplug", "devplug-fake", "devplug-nvidia"}


def saved_names(source: str) -> set[str]:
    """Modules a guide has the reader save as files (``# fpga.py`` blocks)."""
    return {b.file_name.removesuffix(".py") for b in PYTHON if b.source == source and b.file_name}


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_blocks_compile_and_their_imports_resolve(block: Block) -> None:
    tree = ast.parse(block.text, str(block))
    local = saved_names(block.source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            if node.module.split(".")[0] in local:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                found = hasattr(module, alias.name) or find_spec(f"{node.module}.{alias.name}")
                assert found, f"{block}: {node.module} has no {alias.name}"


@pytest.fixture
def fpga_project() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_author_guide_plugin_and_its_tests_pass(fpga_project: Path) -> None:
    (plugin,) = [b for b in AUTHOR if b.file_name == "fpga.py"]
    (conftest,) = [b for b in AUTHOR if "def anyio_backend" in b.text]
    tests = [b for b in AUTHOR if "from fpga import Fpgas" in b.text and not b.file_name]
    (conformance,) = [b for b in AUTHOR if "run_conformance(" in b.text]
    assert len(tests) == 1, [str(b) for b in tests]
    (fpga_project / "fpga.py").write_text(plugin.text)
    (fpga_project / "conftest.py").write_text(conftest.text)
    (fpga_project / "test_fpga.py").write_text(tests[0].text)
    # The conformance block starts fpga.py as a process, with the guide's own --pattern option.
    (fpga_project / "test_conformance.py").write_text(conformance.text)
    # Files the guide names (``# test_fpga_dra.py``, ``# fpga_attacher.py``): the DRA driver's
    # tests, and the modules they import.
    named = [b for b in AUTHOR if b.file_name and b.file_name != "fpga.py"]
    assert {b.file_name for b in named} >= {
        "test_fpga_dra.py",
        "test_fpga_both.py",
        "test_dra_conformance.py",
        "fpga_attacher.py",
    }
    for block in named:
        assert not (fpga_project / str(block.file_name)).exists(), f"{block}: a second {block.file_name}"
        (fpga_project / str(block.file_name)).write_text(block.text)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=fpga_project,
        env=environment(),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "8 passed" in result.stdout


def command_lines() -> list[tuple[Block, str]]:
    lines = []
    for block in ALL:
        if block.lang not in ("sh", ""):
            continue
        for raw in block.text.splitlines():
            line = raw.split("  #", 1)[0].strip()  # a trailing comment
            if line and shlex.split(line)[0] in OURS | EXTERNAL:
                lines.append((block, line))
    return lines


LINES = command_lines()


def test_the_shell_blocks_run_known_commands() -> None:
    commands = {b for b in ALL if b.lang == "sh"}
    assert commands <= {b for b, _ in LINES}, "an sh block whose commands this test does not know"
    assert any(shlex.split(line)[0] == "devplug" for _, line in LINES)


@pytest.mark.parametrize(("block", "line"), LINES, ids=[f"{b}:{line[:40]}" for b, line in LINES])
def test_devplug_command_lines_name_flags_that_exist(block: Block, line: str, fpga_project: Path) -> None:
    argv = shlex.split(line)
    if argv[0] in EXTERNAL:
        return  # needs a cluster or a registry; the command itself is the user's
    ours, _, _ = line.partition(" -- ")  # after --: the plugin's own command line
    words = shlex.split(ours)
    # The sub-command (and MODULE:CLASS for run) are what --help is asked of.
    head: list[str] = []
    if argv[0] == "devplug":
        head = words[1:3] if words[1] == "run" or words[1:3] == ["kubelet", "claim"] else words[1:2]
    elif argv[0] == "devplug-nvidia" and words[1:2] in (["labels"], ["fake-root"]):
        head = words[1:2]
    if head[:1] == ["run"]:
        (fpga_project / "fpga.py").write_text(next(b.text for b in AUTHOR if b.file_name == "fpga.py"))
    known = help_text([*command(argv[0]), *head], cwd=fpga_project)
    missing = [f for f in flags(ours) if f not in known]
    assert not missing, f"{block}: {line!r} names flags {missing} that {' '.join([argv[0], *head])} lacks"
