"""The package's layering rules, checked on the import statements of every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(pattern: str) -> list[Path]:
    return sorted(p for p in ROOT.glob(pattern) if "_proto" not in p.parts)


def _forbidden(paths: list[Path], prefixes: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        for name in sorted(imports_of(path))
        if name.startswith(prefixes)
    ]


def test_framework_never_imports_a_backend() -> None:
    assert not _forbidden(modules("devplug/**/*.py"), ("devplug_fake", "devplug_nvidia"))


def test_core_never_imports_the_testing_kit_or_the_commands() -> None:
    bad = _forbidden(modules("devplug/_core/*.py"), ("devplug.testing", "devplug.cli", "devplug._demo"))
    assert not bad


@pytest.mark.parametrize("module", ["models", "errors", "policies", "topology", "cdi", "health"])
def test_pure_modules_have_no_grpc(module: str) -> None:
    assert not _forbidden([ROOT / "devplug" / f"{module}.py"], ("grpc", "devplug._proto", "devplug._core"))


def test_testing_kit_uses_the_runtime_only_through_the_public_api() -> None:
    assert not _forbidden(modules("devplug/testing/*.py"), ("devplug._core",))
