"""The MPS control daemon a ``sharing.mps`` resource depends on, and the checks made on it.

NVIDIA's ``mps-control-daemon`` runs one ``nvidia-cuda-mps-control -d`` per resource with its
files under the MPS root (``--mps-root`` on the host, mounted at ``/mps`` in NVIDIA's pods):
``<root>/<resource>/pipe`` (the pipes clients talk to), ``<root>/<resource>/log``, ``<root>/shm``,
and ``<root>/<resource>/.started``, created once the daemon has applied the memory and thread
limits. Upstream's plugin waits until that file exists and the daemon answers on its pipe
before it serves the resource. Here the resource is served at once, its devices Unhealthy
(with the reason logged) until the daemon is ready, and Allocate says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devplug.errors import DevplugError

__all__ = ["CONTAINER_ROOT", "CONTROL_BINARY", "MpsDaemon", "MpsDaemonError", "control_command", "mps_view"]

CONTAINER_ROOT = Path("/mps")
"""Where NVIDIA's charts mount the host's MPS root into the plugin's container."""
CONTROL_BINARY = "nvidia-cuda-mps-control"
_PROBE = "get_default_active_thread_percentage"
_PROBE_TIMEOUT = 5.0


class MpsDaemonError(DevplugError):
    """The MPS control daemon of a resource is missing or not ready; the message says what to do."""


def control_command(
    control: str,
    pipe_dir: Path,
    command: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = _PROBE_TIMEOUT,
) -> subprocess.CompletedProcess[bytes]:
    """Send ``command`` (e.g. ``get_default_active_thread_percentage``) to the MPS control daemon
    whose pipes are in ``pipe_dir``, as ``echo command | nvidia-cuda-mps-control`` does.

    Raises:
        OSError: ``control`` cannot be run.
        subprocess.TimeoutExpired: no answer within ``timeout`` seconds.
    """
    full = {**os.environ, **(env or {}), "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    return subprocess.run(
        [control], input=command.encode(), env=full, capture_output=True, timeout=timeout, check=False
    )


def mps_view(mps_root: str, host_root: Path = Path("/")) -> Path:
    """Where this process sees the host's MPS root: ``/mps`` when mounted there (as NVIDIA's
    charts do), else ``mps_root`` under ``host_root``."""
    if CONTAINER_ROOT.is_dir():
        return CONTAINER_ROOT
    return host_root / mps_root.lstrip("/")


@dataclass(frozen=True)
class MpsDaemon:
    """The files of one resource's MPS control daemon, seen from this process.

    Args:
        resource_name: e.g. ``nvidia.com/gpu``.
        root: where this process sees the MPS root (see :func:`mps_view`).
        host_root: the MPS root on the host (``--mps-root``), for messages.
        control: the ``nvidia-cuda-mps-control`` binary used to ask the daemon whether it
            answers; None skips that probe (the binary is not always in the plugin's image).
    """

    resource_name: str
    root: Path
    host_root: str
    control: str | None = None

    @classmethod
    def for_resource(cls, resource_name: str, mps_root: str, host_root: Path = Path("/")) -> MpsDaemon:
        """The daemon of ``resource_name``, probed with ``nvidia-cuda-mps-control`` when on PATH."""
        return cls(resource_name, mps_view(mps_root, host_root), mps_root, shutil.which(CONTROL_BINARY))

    @property
    def resource_dir(self) -> Path:
        return self.root / self.resource_name

    @property
    def pipe_dir(self) -> Path:
        return self.resource_dir / "pipe"

    @property
    def shm_dir(self) -> Path:
        return self.root / "shm"

    @property
    def started_file(self) -> Path:
        return self.resource_dir / ".started"

    def check(self) -> None:
        """Check what upstream checks before serving the resource.

        Raises:
            MpsDaemonError: the first thing missing, and what to do about it.
        """
        start = (
            "deploy NVIDIA's MPS control daemon (the mps-control-daemon daemonset of the "
            f"nvidia-device-plugin chart) on this node with the same config, and mount the host's "
            f"--mps-root ({self.host_root}) into this container at {CONTAINER_ROOT}"
        )
        if not self.root.is_dir():
            raise MpsDaemonError(f"MPS root {self.root} does not exist: {start}")
        if not self.resource_dir.is_dir():
            raise MpsDaemonError(
                f"no MPS control daemon for {self.resource_name}: {self.resource_dir} does not exist; {start}"
            )
        if not self.started_file.exists():
            raise MpsDaemonError(
                f"the MPS control daemon for {self.resource_name} has not signalled readiness "
                f"({self.started_file} is missing): it is starting, or failed; check its pod's log"
            )
        for path, what in ((self.pipe_dir, "pipe directory"), (self.shm_dir, "shm directory")):
            if not path.is_dir():
                raise MpsDaemonError(
                    f"the MPS control daemon's {what} {path} is missing for {self.resource_name}: "
                    "restart the MPS control daemon"
                )
        if self.control is not None:
            self._probe(self.control)

    def _probe(self, control: str) -> None:
        # What upstream asks the daemon to tell that it answers on its pipe.
        try:
            result = control_command(control, self.pipe_dir, _PROBE)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsDaemonError(
                f"the MPS control daemon for {self.resource_name} does not answer on {self.pipe_dir}: {exc}"
            ) from None
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).decode(errors="replace").strip()
            raise MpsDaemonError(
                f"the MPS control daemon for {self.resource_name} does not answer on {self.pipe_dir} "
                f"({control} exited {result.returncode}{': ' + detail if detail else ''}): restart it"
            )
