"""Code blocks of the README and the guides, and running the commands they show."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
_FILE_NAME = re.compile(r"# ([\w.-]+\.py)\n")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language tag (may be empty), text and first line in the file."""

    source: str
    lang: str
    text: str
    line: int

    @property
    def file_name(self) -> str | None:
        """``name.py`` when the block starts with ``# name.py`` (the file a user saves it as)."""
        found = _FILE_NAME.match(self.text)
        return found[1] if found else None

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path.name, m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def command(name: str) -> list[str]:
    """How to start one of the console scripts of this checkout: the installed script itself."""
    script = BIN / name
    if script.exists():
        return [str(script)]
    module = {"devplug": "devplug", "devplug-fake": "devplug_fake", "devplug-nvidia": "devplug_nvidia"}[name]
    return [sys.executable, "-m", module]


def environment() -> dict[str, str]:
    """The environment of a user's shell: this checkout's scripts on PATH, nothing on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPLUG_", "PYTEST_"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def help_text(argv: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(
        [*argv, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd or ROOT,
        env=environment(),
    )
    assert result.returncode == 0, f"{shlex.join(argv)} --help: {result.stderr}"
    return result.stdout


def flags(line: str) -> list[str]:
    """The ``--flags`` of one command line (``--flag=value`` counts as ``--flag``)."""
    return [word.split("=", 1)[0] for word in shlex.split(line) if word.startswith("--")]
