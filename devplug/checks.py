"""Checks on what a plugin is about to hand the kubelet, run before the kubelet sees it.

A device node or mount whose host path does not exist is accepted by the kubelet and fails
later, in the container runtime, with an error far from its cause. devplug's Allocate path
runs :func:`check_host_paths` on every answer (``host_path_check``: warn by default, or refuse,
or off); plugins can call it themselves too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog

from devplug.errors import DevplugError

if TYPE_CHECKING:
    from devplug.models import ContainerAllocation

__all__ = ["HostPathError", "HostPathProblem", "check_host_paths", "host_path_problems"]

CheckMode = Literal["off", "warn", "refuse"]


@dataclass(frozen=True)
class HostPathProblem:
    """One host path of an allocation that will not work."""

    kind: Literal["device", "mount"]
    host_path: str
    container_path: str
    reason: Literal["missing", "not absolute", "not a device node"]

    def __str__(self) -> str:
        return f"{self.kind} host path {self.host_path} (for {self.container_path}): {self.reason}"


class HostPathError(DevplugError):
    """An allocation names host paths that do not exist (``host_path_check=refuse``)."""

    def __init__(self, problems: list[HostPathProblem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def host_path_problems(
    allocation: ContainerAllocation, *, root: str | os.PathLike[str] = "/"
) -> list[HostPathProblem]:
    """Every device node or mount of ``allocation`` whose host path will not work.

    A device's host path must exist and be a character or block device; a mount's must exist.
    Paths are looked up under ``root`` (where this process sees the host's ``/``).
    """
    prefix = os.fspath(root).rstrip("/")  # string joins: this runs on every Allocate
    problems: list[HostPathProblem] = []
    entries: list[tuple[Literal["device", "mount"], str, str]] = [
        ("device", d.host_path, d.container_path) for d in allocation.devices
    ]
    entries += [("mount", m.host_path, m.container_path) for m in allocation.mounts]
    for kind, host_path, container_path in entries:
        if not host_path.startswith("/"):
            problems.append(HostPathProblem(kind, host_path, container_path, "not absolute"))
            continue
        try:
            mode = os.stat(prefix + host_path).st_mode
        except OSError:
            problems.append(HostPathProblem(kind, host_path, container_path, "missing"))
            continue
        if kind == "device" and not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
            problems.append(HostPathProblem(kind, host_path, container_path, "not a device node"))
    return problems


def check_host_paths(
    allocation: ContainerAllocation,
    *,
    mode: CheckMode = "refuse",
    root: str | os.PathLike[str] = "/",
    log: Any = None,
) -> list[HostPathProblem]:
    """Check ``allocation``'s host paths: log each problem (``warn``) or raise (``refuse``).

    Returns the problems found (none are looked for with ``off``).

    Raises:
        HostPathError: ``mode`` is ``refuse`` and a problem was found; its message names
            every offending path.
    """
    if mode == "off":
        return []
    problems = host_path_problems(allocation, root=root)
    if problems and mode == "refuse":
        raise HostPathError(problems)
    logger = log if log is not None else structlog.get_logger("devplug.checks")
    for problem in problems:
        logger.warning(
            "host_path_invalid",
            kind=problem.kind,
            host_path=problem.host_path,
            container_path=problem.container_path,
            reason=problem.reason,
        )
    return problems
