"""What ``import devplug`` and the console scripts' entry modules load before any work is done.

Start-up time is mostly imports: a command that loads pydantic, structlog and grpc before
``main()`` runs makes every start (and the window where Ctrl-C cannot be handled yet) longer.
Each check runs a fresh interpreter and lists the modules the import added to a bare start:
the standard library and a short named list only. Speed itself is measured in bench/startup.py.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Beyond the standard library, what an import may load: the package of the entry point and its
# own light modules. Everything else (pydantic, structlog, grpc, protobuf, anyio, yaml,
# prometheus_client, lightkube, the models) waits until it is used.
ALLOWED = {
    "devplug": {"devplug", "devplug._lazy"},
    "devplug.cli": {"devplug", "devplug._lazy", "devplug.cli"},
    "devplug_fake": {"devplug", "devplug._lazy", "devplug_fake"},
    "devplug_fake.__main__": {"devplug", "devplug._lazy", "devplug_fake", "devplug_fake.__main__"},
    "devplug_nvidia": {"devplug", "devplug._lazy", "devplug_nvidia"},
    "devplug_nvidia.__main__": {"devplug", "devplug._lazy", "devplug_nvidia", "devplug_nvidia.__main__"},
}

_LIST = "import sys, json; {stmt}; print(json.dumps(sorted(sys.modules)))"


def loaded_by(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after ``statement``, less those of a bare start."""

    def modules(stmt: str) -> set[str]:
        out = subprocess.run(
            [sys.executable, "-c", _LIST.format(stmt=stmt)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        return set(json.loads(out))

    return modules(statement) - modules("pass")


def outside_allow_list(loaded: set[str], allowed: set[str]) -> list[str]:
    stdlib = sys.stdlib_module_names
    return sorted(m for m in loaded if m.split(".")[0] not in stdlib and m not in allowed)


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: name → ``module:function``."""
    text = (ROOT / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?:^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    assert section is not None
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section.group(1), re.MULTILINE))


def test_import_devplug_loads_no_dependency() -> None:
    loaded = loaded_by("import devplug")
    assert "devplug" in loaded  # the probe worked
    assert outside_allow_list(loaded, ALLOWED["devplug"]) == []


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_entry_modules_load_no_dependency(module: str) -> None:
    loaded = loaded_by(f"import {module}")
    assert module in loaded
    assert outside_allow_list(loaded, ALLOWED[module]) == []


@pytest.mark.parametrize("script", sorted(console_scripts()))
def test_console_scripts_load_no_dependency_before_main(script: str) -> None:
    """What the installed script does before calling its function: import it, look it up."""
    module, _, function = console_scripts()[script].partition(":")
    assert module in ALLOWED, f"{script}: {module} has no allow-list here"
    loaded = loaded_by(f"from {module} import {function}")
    assert outside_allow_list(loaded, ALLOWED[module]) == []


def test_the_allow_list_check_catches_a_heavy_import() -> None:
    """The probe sees a dependency that the public names load once they are used."""
    loaded = loaded_by("from devplug import Device")
    assert {"pydantic", "devplug.models"} <= set(outside_allow_list(loaded, ALLOWED["devplug"]))


@pytest.mark.parametrize("package", ["devplug", "devplug_fake", "devplug_nvidia"])
def test_lazy_names_resolve(package: str) -> None:
    """Every name of ``__all__`` is there on first use, and listed by dir()."""
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
        assert name in dir(module), name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = module.not_a_name


def test_building_the_devplug_parser_loads_no_testing_kit() -> None:
    """``devplug run`` builds every sub-command's parser first: none of them may pull in the
    testing kit or the API server's client library, which a plugin's start never uses."""
    loaded = loaded_by(
        "from devplug.cli import _conformance; from devplug.cli.inspect import command; "
        "from devplug.cli.kubelet import command"
    )
    assert "devplug.cli.kubelet.command" in loaded
    heavy = sorted(m for m in loaded if m.startswith(("devplug.testing", "lightkube", "httpx", "yaml")))
    assert heavy == []


def test_serving_loads_no_config_file_reader() -> None:
    """The runtime and the fake backend load PyYAML with a config or state file, and the
    allocation policies with a resource that has one, not before."""
    loaded = loaded_by("import devplug._main, devplug_fake._plugin, devplug_fake._config")
    assert "devplug._device_plugin.runner" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in {"yaml", "lightkube", "httpx"}) == []
    assert "devplug.policies" not in loaded


def test_the_device_plugin_runtime_loads_only_what_serving_uses() -> None:
    """``devplug.run`` for a device plugin: no policies (the first GetPreferredAllocation loads
    them), no CDI models, no topology scan, no DRA runtime, no Prometheus."""
    loaded = loaded_by("import devplug._main")
    assert "devplug._device_plugin.runner" in loaded
    unused = ("devplug.policies", "devplug.cdi", "devplug.topology", "devplug._dra", "devplug.dra")
    assert sorted(m for m in loaded if m.startswith(unused)) == []
    assert sorted(m for m in loaded if m.split(".")[0] in {"prometheus_client", "yaml", "lightkube"}) == []
