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


def test_test_modules_have_unique_names() -> None:
    """Test directories are not packages, so pytest imports each test module under its file name
    alone: two files of one name stop the collection of the whole run ("import file mismatch")."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}
