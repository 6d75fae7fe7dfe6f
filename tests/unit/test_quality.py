"""ruff and mypy --strict over the packages, as part of the test run (skipped without the dev extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("ruff", "check", "."),
        ("ruff", "format", "--check", "."),
        ("mypy",),
        ("mypy", "--strict", "e2e/localnode.py"),
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict", "mypy-strict-e2e-node"],
)
def test_clean(args: tuple[str, ...]) -> None:
    result = subprocess.run(
        [_tool(args[0]), *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
