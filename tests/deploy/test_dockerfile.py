"""The Dockerfile, read (there is no container engine in the test run): two stages on one slim
Python base, the wheel built in the first and installed with the nvidia and metrics extras in
the second, no build tools in the final image, a non-root user, devplug-nvidia as the command."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
EXTRAS = ("dra", "nvidia", "metrics")
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6?-dev|apt-get|apk|dnf|yum|"
    r"pip wheel|python -m build|setup\.py)\b"
)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)
    """(INSTRUCTION, arguments), continuation lines joined."""

    def all(self, instruction: str) -> list[str]:
        return [args for ins, args in self.instructions if ins == instruction]


def _instructions(text: str) -> list[tuple[str, str]]:
    out = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        instruction, _, args = full.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def _parse() -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction, rest in _instructions(DOCKERFILE.read_text()):
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages and instruction == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value.strip('"')
        else:
            stages[-1].instructions.append((instruction, rest))
    return args, stages


def _project() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_two_stages_on_one_slim_python_base() -> None:
    args, stages = _parse()
    assert len(stages) == 2
    build, final = stages
    assert build.name == "build"
    assert build.base == final.base == "${PYTHON_IMAGE}"
    image = args["PYTHON_IMAGE"]
    match = re.fullmatch(r"python:3\.(\d+)-slim(-[a-z]+)?", image)
    assert match, image
    floor = re.fullmatch(r">=3\.(\d+)", _project()["requires-python"])
    assert floor is not None
    assert int(match[1]) >= int(floor[1])


def test_build_stage_makes_wheels_of_the_extras() -> None:
    _, (build, _) = _parse()
    (run,) = build.all("RUN")
    assert run.startswith("pip wheel ")
    assert "--wheel-dir /wheels" in run
    assert f'".[{",".join(EXTRAS)}]"' in run
    assert set(EXTRAS) <= set(_project()["optional-dependencies"])
    # What is copied exists, and .dockerignore does not hide it.
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [p for c in build.all("COPY") for p in c.split()[:-1]]
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source
    assert {".git", ".venv", "tests"} <= set(ignored)
    # The readme is part of the package metadata: without it the wheel does not build.
    assert _project()["readme"] in copied


def test_final_stage_installs_the_wheels_offline_without_build_tools() -> None:
    _, (_, final) = _parse()
    runs = final.all("RUN")
    (install,) = runs
    assert "--mount=type=bind,from=build,source=/wheels,target=/wheels" in install
    assert f'pip install --no-cache-dir --no-index --find-links /wheels "devplug[{",".join(EXTRAS)}]"' in (
        install
    )
    assert "pip uninstall --yes setuptools wheel" in install
    for command in runs:
        without_uninstall = command.replace("pip uninstall --yes setuptools wheel", "")
        assert not BUILD_TOOLS.search(without_uninstall), command
    # Nothing from the build context reaches the final image except through the wheels.
    assert not final.all("COPY")
    assert not final.all("ADD")


def test_final_stage_runs_devplug_nvidia_as_a_non_root_user() -> None:
    _, (_, final) = _parse()
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert gid.isdigit() and int(gid) != 0
    (install,) = final.all("RUN")
    assert f"--uid {uid}" in install
    assert f"--gid {gid}" in install
    (entrypoint,) = final.all("ENTRYPOINT")
    command = json.loads(entrypoint)  # the exec form: signals reach the plugin, not a shell
    assert command == ["devplug-nvidia"]
    assert command[0] in _project()["scripts"]
    assert not final.all("CMD")


def test_image_version_and_runtime_environment() -> None:
    _, (_, final) = _parse()
    (labels,) = final.all("LABEL")
    assert f'org.opencontainers.image.version="{_project()["version"]}"' in labels
    (env,) = final.all("ENV")
    # What the NVIDIA container runtime gives the plugin's container: every GPU and NVML.
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env
    # The DaemonSets run with a read-only root filesystem.
    assert "PYTHONDONTWRITEBYTECODE=1" in env
