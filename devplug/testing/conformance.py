"""Conformance checks: run a plugin command against a private fake kubelet and judge what it does.

Each check is derived from what the kubelet does (docs/kubelet-protocol.md) and from the
mistakes real plugins made. Plugin authors run them from the command line
(``devplug conformance -- CMD ...``) or from pytest::

    @pytest.mark.anyio
    async def test_conformance() -> None:
        report = await run_conformance([sys.executable, "-m", "my_plugin", "--device-plugin-dir", "{dir}"])
        assert report.passed, report.failures

The checks assume the plugin's device set does not change while they run (they change nothing
themselves), and that the plugin registers through ``kubelet.sock`` (not the plugin watcher).

:func:`run_dra_conformance` does the same for a DRA driver (``devplug conformance --dra -- CMD``),
against a private FakeKubelet in DRA mode and a FakeKubeAPI, with the checks of
:data:`DRA_CHECKS`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from devplug.testing._conformance.dra_judges import DRA_CHECKS
from devplug.testing._conformance.judges import CHECKS, CheckStatus
from devplug.testing._conformance.session import Session

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "CHECKS",
    "DRA_CHECKS",
    "CheckResult",
    "CheckStatus",
    "ConformanceReport",
    "run_conformance",
    "run_dra_conformance",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class CheckResult(_Frozen):
    """The outcome of one check."""

    name: str
    """One of :data:`CHECKS` (:data:`DRA_CHECKS` for a DRA driver)."""
    status: CheckStatus
    """``"pass"``, ``"fail"``, or ``"skip"`` (not applicable, or an earlier step failed)."""
    reason: str
    """One line: what was seen, or why the check could not run."""


class ConformanceReport(_Frozen):
    """Every check's result for one run of a plugin command."""

    command: tuple[str, ...]
    """The command as started (placeholders substituted)."""
    resource: str | None
    """The resource checked (the first one registered unless chosen), or for a DRA driver the
    driver name; ``None`` if none registered."""
    results: tuple[CheckResult, ...]
    """One result per check, in the order of :data:`CHECKS` (:data:`DRA_CHECKS`)."""
    output_tail: str = ""
    """The end of the plugin's stdout and stderr, for finding out why a check failed."""
    api: Literal["deviceplugin", "dra"] = "deviceplugin"
    """Which protocol was checked: a device plugin or a DRA driver."""

    @property
    def passed(self) -> bool:
        """No check failed (skipped ones do not count)."""
        return not self.failures

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        """The failed checks."""
        return tuple(r for r in self.results if r.status == "fail")

    def result(self, name: str) -> CheckResult:
        """The result of check ``name``.

        Raises:
            KeyError: no such check.
        """
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)


async def run_conformance(
    command: Sequence[str],
    *,
    resource: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    restarts: int = 3,
    directory: Path | str | None = None,
) -> ConformanceReport:
    """Start ``command`` against a private fake kubelet, run every check, stop it, report.

    The device-plugin directory is a fresh temporary one, passed to the command as the
    environment variable ``DEVPLUG_DEVICE_PLUGIN_DIR`` and substituted for every literal
    ``{dir}`` in its arguments. The fake kubelet behaves like kubelet >= 1.26 (synchronous
    Register that dials back). The command is stopped with SIGTERM at the end (and killed, with
    its process group, if it does not exit within 5 s).

    Args:
        command: the plugin's command line.
        resource: the resource to check; default: the first one that registers.
        env: extra environment for the command (on top of this process's).
        timeout: seconds to wait for the first registration and for each re-registration.
        restarts: kubelet restarts to survive (at least 1 for the restart checks to run).
        directory: where to make the temporary directory (default ``/tmp``: unix socket paths
            are limited to 107 bytes); it is removed afterwards.

    Raises:
        OSError: the command could not be started (e.g. not found).
        ValueError: an empty command.
    """
    if not command:
        raise ValueError("no command to run")
    root = _make_root(directory)
    try:
        dp_dir = root / "dp"
        argv = tuple(arg.replace("{dir}", str(dp_dir)) for arg in command)
        environ = {**os.environ, **(env or {}), "DEVPLUG_DEVICE_PLUGIN_DIR": str(dp_dir)}
        session = Session(argv, environ, dp_dir, root / "plugin.log", resource=resource, timeout=timeout)
        results = await session.run(restarts=restarts)
        return ConformanceReport(
            command=argv,
            resource=session.resource,
            results=tuple(
                CheckResult(name=name, status=results[name][0], reason=results[name][1]) for name in CHECKS
            ),
            output_tail=session.plugin.output_tail(),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def run_dra_conformance(
    command: Sequence[str],
    *,
    driver: str | None = None,
    node_name: str = "node-1",
    env: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    directory: Path | str | None = None,
) -> ConformanceReport:
    """Start the DRA driver ``command`` against a private FakeKubeAPI and FakeKubelet, check it, stop it.

    The driver may be written in any language: it is told where things are the way a DaemonSet
    tells it. The environment has ``NODE_NAME`` (``node_name``, a Node of the fake API server)
    and ``KUBECONFIG`` (a kubeconfig for the fake API server), and, for drivers built on
    devplug, ``DEVPLUG_KUBELET_ROOT`` and ``DEVPLUG_CDI_DIR``. In the arguments, ``{kubelet_root}``
    (the kubelet's root: ``plugins_registry/`` and ``plugins/`` are in it), ``{kubeconfig}``,
    ``{node}`` and ``{cdi_dir}`` (where the checks look for CDI specs) are replaced. The
    kubelet behaves like kubelet >= 1.34. The driver is stopped with SIGTERM at the end (and
    killed, with its process group, if it does not exit within 2 s).

    Args:
        command: the driver's command line.
        driver: the driver to check; default: the first that registers.
        node_name: the node the driver serves.
        env: extra environment for the command (on top of this process's).
        timeout: seconds to wait for the registration, the slices and the first health report.
        directory: where to make the temporary directory (default ``/tmp``: unix socket paths
            are limited to 107 bytes); it is removed afterwards.

    Raises:
        OSError: the command could not be started (e.g. not found).
        ValueError: an empty command.
    """
    if not command:
        raise ValueError("no command to run")
    root = _make_root(directory)
    try:
        paths = {
            "kubelet_root": root / "kubelet",
            "kubeconfig": root / "kubeconfig",
            "cdi_dir": root / "cdi",
            "log": root / "driver.log",
        }
        values = {
            "{kubelet_root}": str(paths["kubelet_root"]),
            "{kubeconfig}": str(paths["kubeconfig"]),
            "{node}": node_name,
            "{cdi_dir}": str(paths["cdi_dir"]),
        }
        argv = tuple(_substitute(arg, values) for arg in command)
        environ = {
            **os.environ,
            **(env or {}),
            "NODE_NAME": node_name,
            "KUBECONFIG": values["{kubeconfig}"],
            "DEVPLUG_KUBELET_ROOT": values["{kubelet_root}"],
            "DEVPLUG_CDI_DIR": values["{cdi_dir}"],
        }
        from devplug._extras import require

        require("testing", "run_dra_conformance")  # its API server is the testing kit's
        from devplug.testing._conformance.dra_session import DraSession

        session = DraSession(argv, environ, paths, driver=driver, node=node_name, timeout=timeout)
        results = await session.run()
        return ConformanceReport(
            command=argv,
            resource=session.driver,
            results=tuple(
                CheckResult(name=name, status=results[name][0], reason=results[name][1])
                for name in DRA_CHECKS
            ),
            output_tail=session.plugin.output_tail(),
            api="dra",
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _substitute(arg: str, values: Mapping[str, str]) -> str:
    for placeholder, value in values.items():
        arg = arg.replace(placeholder, value)
    return arg


def _make_root(directory: Path | str | None) -> Path:
    # /tmp by default, not the (often long) default temporary directory: AF_UNIX paths are
    # limited to 107 bytes.
    parent = directory if directory is not None else "/tmp"  # noqa: S108
    return Path(tempfile.mkdtemp(prefix="dpc-", dir=parent)).absolute()
