"""devplug_nvidia's layering rules, as its sub-packages' docstrings state them.

Every import statement counts (top level, ``if TYPE_CHECKING:`` and inside functions), and
``from devplug_nvidia import labels`` is an import of ``devplug_nvidia.labels``: the scan is
tests/unit/test_layers.py's module graph.
"""

from __future__ import annotations

import ast
from functools import cache

import pytest

from tests.unit.test_layers import ROOT, import_graph

PACKAGE = "devplug_nvidia"


@cache
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, (PACKAGE,))


def _full(name: str) -> str:
    return f"{PACKAGE}.{name}"


def _within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == _full(n) or module.startswith(_full(n) + ".") for n in names)


def imports_outside(package: str, allowed: tuple[str, ...]) -> list[str]:
    """What the modules of ``package`` import of devplug_nvidia beyond ``package`` and ``allowed``."""
    return [
        f"{module} imports {imported}"
        for module, imported_set in sorted(graph().items())
        if _within(module, (package,))
        for imported in sorted(imported_set)
        if not _within(imported, (package, *allowed))
    ]


def importers_of(names: tuple[str, ...], among: tuple[str, ...]) -> list[str]:
    """Which modules of ``among`` import one of ``names``."""
    return [
        f"{module} imports {imported}"
        for module, imported_set in sorted(graph().items())
        if _within(module, among)
        for imported in sorted(imported_set)
        if _within(imported, names)
    ]


# Sub-package → what else of devplug_nvidia it may import (its docstring says why).
ALLOWED: dict[str, tuple[str, ...]] = {
    "_config": (),  # pure: the config file and feature gates, no NVML
    "_gpu": (),  # GPU access shared by both APIs: imports neither side
    "_discovery": ("_gpu",),
    "_container": ("_gpu", "config", "_config"),
    "_labels": ("_gpu", "_discovery", "discovery", "config", "_config"),
    "_device_plugin": ("_gpu", "_container", "_discovery", "discovery", "config", "_config"),
    "_dra": ("_gpu", "_container", "_discovery", "discovery", "config", "_config"),
}


def test_every_sub_package_has_a_rule_and_states_it() -> None:
    found = sorted(p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").exists())
    assert sorted([*ALLOWED, "_cli", "testing"]) == found
    for name in [*ALLOWED, "_cli"]:
        docstring = ast.get_docstring(ast.parse((ROOT / PACKAGE / name / "__init__.py").read_text()))
        assert docstring
        assert "Rule:" in docstring, name


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_sub_package_imports_only_what_its_rule_allows(package: str) -> None:
    assert any(_within(m, (package,)) for m in graph())  # the scan found its modules
    assert not imports_outside(package, ALLOWED[package])


def test_the_device_plugin_side_and_the_dra_side_never_import_each_other() -> None:
    device_plugin, dra = ("_device_plugin", "plugin"), ("_dra", "dra")
    assert not importers_of(dra, device_plugin)
    assert not importers_of(device_plugin, dra)


def test_only_the_public_front_imports_the_command() -> None:
    """_cli sits on top: the package root, ``python -m devplug_nvidia`` and the labels command."""
    front = ("_cli", "__main__", "labels")
    users = {
        module
        for module, imported in graph().items()
        if any(_within(i, ("_cli",)) for i in imported) and not _within(module, front)
    }
    assert users <= {PACKAGE}
    assert PACKAGE in users  # the root's serve_gpus: the scan sees it


def test_the_rules_see_a_from_import_of_a_module() -> None:
    """``from devplug_nvidia._cli import _fake_root`` counts as importing the module itself."""
    assert _full("_cli._fake_root") in graph()[_full("_cli._main")]
    assert _full("_gpu._nvml") in graph()[_full("discovery")]
