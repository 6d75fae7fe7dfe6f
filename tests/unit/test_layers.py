"""The package's layering rules, checked on the import statements of every module."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("devplug", "devplug_fake", "devplug_nvidia")
# Who may import the commands (devplug/cli): the commands themselves, ``python -m devplug``, and
# the programs around the library.
COMMAND_USERS = ("devplug.cli", "devplug.__main__", "tests.", "bench.")


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


@pytest.mark.parametrize("package", ["_runtime", "_device_plugin", "_dra"])
def test_runtimes_never_import_the_testing_kit_or_the_commands(package: str) -> None:
    bad = _forbidden(modules(f"devplug/{package}/*.py"), ("devplug.testing", "devplug.cli"))
    assert not bad


def test_the_shared_runtime_never_imports_a_service() -> None:
    """devplug/_runtime/__init__.py states it: the services plug into it."""
    bad = _forbidden(
        modules("devplug/_runtime/*.py"),
        ("devplug._device_plugin", "devplug._dra", "devplug.dra", "lightkube", "httpx"),
    )
    assert not bad


@pytest.mark.parametrize(
    "module",
    [
        "models",
        "errors",
        "policies",
        "topology",
        "cdi",
        "health",
        "_hooks",
        "_resource_claim",
        "_settings_groups",
    ],
)
def test_pure_modules_have_no_grpc(module: str) -> None:
    bad = ("grpc", "devplug._proto", "devplug._runtime", "devplug._device_plugin")
    assert not _forbidden([ROOT / "devplug" / f"{module}.py"], bad)


def test_the_versioned_value_is_pure() -> None:
    """devplug/_versioned.py serves the runtimes, the testing kit and the backends alike: anyio only."""
    stdlib = sys.stdlib_module_names
    names = imports_of(ROOT / "devplug" / "_versioned.py")
    assert {n for n in names if n.split(".")[0] not in stdlib} == {"anyio"}


def test_the_device_plugin_runtime_never_imports_dra() -> None:
    """DRA and the device-plugin service sit side by side on _runtime: neither imports the other."""
    dra = ("devplug._dra", "devplug.dra", "lightkube")
    assert not _forbidden(modules("devplug/_device_plugin/*.py"), dra)
    assert not _forbidden(modules("devplug/_dra/*.py"), ("devplug._device_plugin",))


def test_dra_runtime_never_imports_the_testing_kit_or_the_commands() -> None:
    assert not _forbidden(modules("devplug/_dra/*.py"), ("devplug.testing", "devplug.cli"))


def test_only_kube_talks_to_the_api_client() -> None:
    """One module of the DRA runtime holds the client library; the rest pass plain dicts."""
    users = {
        str(path.relative_to(ROOT))
        for path in modules("devplug/**/*.py")
        if any(name.startswith(("lightkube", "httpx")) for name in imports_of(path))
    }
    assert {u for u in users if not u.startswith("devplug/testing/")} == {"devplug/_dra/kube.py"}


@pytest.mark.parametrize("module", ["names", "slices", "inventory", "checkpoint", "allocation"])
def test_pure_dra_modules_have_no_grpc_and_no_client(module: str) -> None:
    path = ROOT / "devplug" / "_dra" / f"{module}.py"
    assert not _forbidden([path], ("grpc", "devplug._proto", "lightkube", "httpx"))


def test_the_allocation_records_are_plain_data() -> None:
    """devplug/_dra/allocation.py states it: the claim's allocation parsed, no I/O: the standard
    library only."""
    names = imports_of(ROOT / "devplug" / "_dra" / "allocation.py")
    assert {n for n in names if n.split(".")[0] not in sys.stdlib_module_names} == set()


def test_testing_kit_uses_the_runtime_only_through_the_public_api() -> None:
    private = ("devplug._runtime", "devplug._device_plugin", "devplug._dra")
    assert not _forbidden(modules("devplug/testing/**/*.py"), private)


def runtime_imports_of(path: Path) -> set[str]:
    """The modules ``path`` imports outside its ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_fake_api_server_never_imports_the_kubelets_or_the_conformance_checks() -> None:
    """devplug/testing/_kubeapi/__init__.py states it."""
    bad = _forbidden(
        modules("devplug/testing/_kubeapi/*.py"), ("devplug.testing._kubelet", "devplug.testing._conformance")
    )
    assert not bad


def test_the_fake_kubelets_use_the_api_server_for_types_only_and_never_the_checks() -> None:
    """devplug/testing/_kubelet/__init__.py states it: it needs no extra."""
    paths = modules("devplug/testing/_kubelet/*.py")
    assert not _forbidden(paths, ("devplug.testing._conformance",))
    at_run_time = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        for name in sorted(runtime_imports_of(path))
        if name.startswith(("devplug.testing._kubeapi", "h11", "lightkube"))
    ]
    assert not at_run_time


# -- the module graph ------------------------------------------------------------------------------
#
# Every import statement counts: at the top, under ``if TYPE_CHECKING:`` and inside functions. A
# circle hidden in a type-only or a late import is still two modules that cannot be understood,
# tested or moved one without the other.


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name → file, for every module of ``packages`` (the generated ``_proto`` left out)."""
    return {
        module_name(root, path): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if "_proto" not in path.relative_to(root).parts
    }


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that the statements of module ``name`` import.

    ``from pkg import name`` imports the submodule ``pkg.name`` when there is one, and the package
    ``pkg`` for every other name; relative imports are resolved against ``name``'s package, and a
    module inside a sub-package imports that sub-package too.
    """
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            submodules = {f"{source}.{alias.name}" for alias in node.names} & known
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(source)
    # Importing ``a.b.c`` runs the ``a.b`` package first: from outside ``a.b`` that is an import of
    # ``a.b`` too (a module inside it is already being imported with it).
    parents = {
        ".".join(module.split(".")[:depth])
        for module in found & known
        for depth in range(2, module.count(".") + 1)
    }
    found |= {p for p in parents if not name.startswith(p + ".")}
    return (found & known) - {name}


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = module_files(root, packages)
    known = set(files)
    return {name: imported_modules(name, path, known) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None when it has none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: dict[str, int] = {}

    def visit(module: str) -> list[str] | None:
        on_path[module] = len(path)
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported in on_path:
                return [*path[on_path[imported] :], imported]
            if imported not in done:
                cycle = visit(imported)
                if cycle is not None:
                    return cycle
        path.pop()
        del on_path[module]
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            cycle = visit(module)
            if cycle is not None:
                return cycle
    return None


def test_no_import_cycles() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 100  # the scan found the modules
    assert "devplug.cli.inspect.command" in graph["devplug.cli"]  # `from devplug.cli.inspect import command`
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


# The three circles this rule was written against, one per way of hiding an import.
_CIRCLES = {
    "type-only": {
        "pkg/cdi.py": "from pkg._files import write_spec",
        "pkg/_files.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.cdi import CdiSpec
        """,
    },
    "in-a-function": {
        "pkg/core/runner.py": """
            def run():
                from pkg.core.probes import ProbeServer
        """,
        "pkg/core/probes.py": """
            class ProbeServer:
                def __init__(self):
                    from .exposition import registry_for
        """,
        "pkg/core/exposition.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from ..core.runner import Runner
        """,
    },
    "submodule-by-name": {
        "pkg/testing/conformance.py": """
            def run_conformance():
                from pkg.testing._conformance import Session
        """,
        "pkg/testing/_conformance.py": "from pkg.testing import _judges as judge",
        "pkg/testing/_judges.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.testing.conformance import CheckStatus
        """,
    },
}


@pytest.mark.parametrize("case", sorted(_CIRCLES))
def test_the_cycle_rule_sees_hidden_imports(tmp_path: Path, case: str) -> None:
    # Packages that re-export their submodules' names, as devplug's do: no circle with them.
    packages = {
        "pkg/__init__.py": "from pkg.cdi import write_spec",
        "pkg/core/__init__.py": "",
        "pkg/testing/__init__.py": "from pkg.testing.conformance import run_conformance",
    }
    for relative, source in {**packages, **_CIRCLES[case]}.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(textwrap.dedent(source).strip() + "\n")
    cycle = find_cycle(import_graph(tmp_path, ("pkg",)))
    assert cycle is not None
    expected = {module_name(tmp_path, tmp_path / relative) for relative in _CIRCLES[case]}
    assert set(cycle) == expected and cycle[0] == cycle[-1]


# -- the commands ----------------------------------------------------------------------------------


def _program_modules() -> dict[str, Path]:
    """The packages' modules and the programs around them (tests, bench, examples, scripts)."""
    files = module_files(ROOT, PACKAGES)
    for folder in ("tests", "bench", "examples", "scripts"):
        files.update({module_name(ROOT, path): path for path in sorted((ROOT / folder).rglob("*.py"))})
    return files


def test_only_the_commands_and_the_programs_around_them_import_the_commands() -> None:
    files = _program_modules()
    known = set(files) | {"devplug.cli"}
    bad = [
        f"{name} imports {imported}"
        for name, path in files.items()
        if not name.startswith(COMMAND_USERS)
        for imported in sorted(imported_modules(name, path, known))
        if imported == "devplug.cli" or imported.startswith("devplug.cli.")
    ]
    assert not bad


def test_the_root_of_devplug_holds_the_library_only() -> None:
    """Every private module at the root of devplug/ serves the library: one that only the
    commands use belongs in devplug/cli."""
    graph = import_graph(ROOT, PACKAGES)
    public = [
        name
        for name in graph
        if not name.startswith(("devplug.cli", "devplug.__main__"))
        and not any(part.startswith("_") for part in name.split("."))
    ]
    library = set(public)
    todo = list(public)
    while todo:
        for imported in graph[todo.pop()] - library:
            library.add(imported)
            todo.append(imported)
    root = [module_name(ROOT, path) for path in sorted((ROOT / "devplug").glob("_*.py"))]
    private = [name for name in root if name not in ("devplug", "devplug.__main__")]
    assert private  # the scan found them
    unused = [name for name in private if name not in library]
    assert not unused, f"not used by the library (commands belong in devplug/cli): {unused}"
    assert not any(name.startswith("devplug.cli") for name in library)
    assert graph["devplug.__main__"] == {"devplug.cli"}
