"""The operator, author and migration guides against the code: every warning and error the
programs log is explained, every flag named exists, every metric named is exported, and every
Kubernetes object shown validates."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devplug_nvidia.config import _FLAG_ALIASES

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDES = ("operator-guide.md", "author-guide.md", "migration-from-nvidia.md")
PACKAGES = ("devplug", "devplug_fake", "devplug_nvidia")
# Code that a cluster's plugin process never runs: the testing kit, and the interactive commands
# (their problems are printed to a terminal, not logged).
NOT_IN_A_PLUGIN = ("devplug/testing/", "devplug/cli/")
LEVELS = frozenset({"warning", "error", "exception", "critical"})
HELP_COMMANDS = (
    ("-m", "devplug_nvidia", "--help"),
    ("-m", "devplug_nvidia", "labels", "--help"),
    ("-m", "devplug_fake", "--help"),
    ("-m", "devplug", "inspect", "--help"),
    ("-m", "devplug", "conformance", "--help"),
)


def _text(name: str) -> str:
    return (DOCS / name).read_text()


def _logged_events() -> dict[str, str]:
    """Event pattern (a regex) → where it is logged, for every warning or worse."""
    events: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/_proto/" in relative or relative.startswith(NOT_IN_A_PLUGIN):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LEVELS
                    and "log" in ast.unparse(node.func.value).lower()
                    and node.args
                ):
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    pattern = re.escape(first.value)
                elif isinstance(first, ast.JoinedStr):  # f"{call}_unknown_devices"
                    pattern = "".join(
                        re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z_]+" for v in first.values
                    )
                else:
                    continue
                events.setdefault(pattern, f"{relative}:{node.lineno}")
    return events


def test_every_warning_and_error_is_in_the_operator_guide() -> None:
    guide = _text("operator-guide.md")
    events = _logged_events()
    assert len(events) > 40  # the scan found the log calls
    missing = {p: where for p, where in events.items() if not re.search(f"`{p}`", guide)}
    assert not missing, f"log events not explained in docs/operator-guide.md: {missing}"


def _known_flags() -> set[str]:
    flags: set[str] = set()
    for args in HELP_COMMANDS:
        result = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=60, check=True, cwd=ROOT
        )
        flags |= set(re.findall(r"--[a-z][a-z0-9.-]*", result.stdout))
    return flags


def test_flags_in_the_guides_exist() -> None:
    known = _known_flags() | set(_FLAG_ALIASES)  # NVIDIA's spellings, accepted and rewritten
    # Named in the migration guide as gpu-feature-discovery's, and not supported: keep it so.
    unsupported = {"--use-node-feature-api"}
    assert not unsupported & known
    known |= unsupported
    assert {"--mig-strategy", "--metrics-address", "--oneshot", "--count", "--allocate"} <= known
    # The author guide also names its example plugin's own flags, and pip's.
    for name in ("operator-guide.md", "migration-from-nvidia.md"):
        # Inline code that starts with a flag: `--flag`, `--flag=value`, `--flag value`.
        # `--health.*` names a family: some flag must start with it.
        named = set(re.findall(r"`(--[a-z][a-z0-9.-]*)", _text(name)))
        unknown = [
            f for f in named if f not in known and not (f[-1] in ".-" and any(k.startswith(f) for k in known))
        ]
        assert not unknown, f"{name} names flags no program has: {sorted(unknown)}"


def test_metrics_in_the_operator_guide_are_exported() -> None:
    source = "\n".join(p.read_text() for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    named = set(re.findall(r"`(devplug_[a-z_]+)`", _text("operator-guide.md")))
    named = {n for n in named if not n.startswith(("devplug_fake", "devplug_event_loop"))}
    assert len(named) > 5
    missing = sorted(n for n in named if n not in source)
    assert not missing, f"metrics named in the operator guide but not in the code: {missing}"


@pytest.mark.parametrize("name", GUIDES)
def test_kubernetes_objects_in_the_guides_validate(name: str) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", _text(name), flags=re.DOTALL)
    for block in blocks:
        for doc in yaml.safe_load_all(block):
            if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
                continue
            try:
                kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']} {'.'.join(map(str, exc.path))}: {exc.message}")


def test_guides_link_to_files_that_exist() -> None:
    for name in GUIDES:
        for target in re.findall(r"\]\(([^)#:]+)\)", _text(name)):
            assert (DOCS / target).exists(), f"{name} links to {target}"
