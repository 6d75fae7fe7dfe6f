"""The MPS control daemons of prepared claims, and the tools shared with time-slicing.

One ``nvidia-cuda-mps-control -d`` per group of a claim (the devices one config applies to), run
by this process as NVIDIA's DRA driver v0.4.1 runs it in a Deployment: its files in
``<plugin dir>/mps/<claim UID>-<5 hex of the sha256 of the sorted UUIDs>/{pipe,shm,log}``
(``shm`` a tmpfs of half the host's memory when this process may mount one), full GPUs in
``EXCLUSIVE_PROCESS``, the thread percentage and pinned-memory limits sent to the daemon, which
must answer within ~15 s. Stopping asks it to ``quit``, removes its files and, beyond NVIDIA
(whose GPUs stay ``EXCLUSIVE_PROCESS``), sets the compute mode ``DEFAULT`` again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from devplug.cdi import CdiMount, ContainerEdits
from devplug.errors import DevplugError
from devplug_nvidia._container._cdi_driver import BINARY_DIRS
from devplug_nvidia._dra._config import GpuConfig, MigDeviceConfig, OpaqueConfigError
from devplug_nvidia._dra._groups import pinned_limits
from devplug_nvidia._gpu._mps import CONTROL_BINARY, control_command
from devplug_nvidia._gpu._nvml import NOT_SUPPORTED, NvmlError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug_nvidia._dra._config import Config, MpsConfig
    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia._gpu._nvml import Nvml

__all__ = [
    "CONTAINER_PIPE_DIR",
    "CONTAINER_SHM_DIR",
    "ClaimSharing",
    "GpuTools",
    "MpsDaemons",
    "NotSupportedError",
    "SharingError",
    "SharingGroup",
    "daemon_id",
]

log = structlog.get_logger("devplug_nvidia.dra")

CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"  # noqa: S108 - where NVIDIA's containers find the MPS pipes
CONTAINER_SHM_DIR = "/dev/shm"  # noqa: S108 - the container's shared memory, backed by the daemon's
_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
_READY_DELAYS = (1.0, 2.0, 4.0, 8.0)  # NVIDIA's backoff while it waits for its daemon (~15 s)
_COMMAND_TIMEOUT = 10.0


class SharingError(DevplugError):
    """Sharing could not be applied or undone; the message is NVIDIA's where it has one."""


class NotSupportedError(SharingError):
    """NVML does not support the setting on this GPU."""


def daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """``<claim UID>-<first 5 hex digits of sha256("uuid1,uuid2,...")>`` (UUIDs sorted)."""
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()
    return f"{claim_uid}-{digest[:5]}"


@dataclass(frozen=True)
class SharingGroup:
    """One group of a claim: its config (normalized and valid) and its devices."""

    config: Config
    requests: tuple[str, ...]
    """The request of each of its results, in order (for NVIDIA's messages)."""
    devices: tuple[tuple[str, GpuRecord], ...]
    """(device name, record) of each of its results."""

    @property
    def uuids(self) -> list[str]:
        return sorted({r.uuid for _, r in self.devices})

    @property
    def gpu_uuids(self) -> list[str]:
        return sorted({r.uuid for _, r in self.devices if r.kind == "gpu"})

    @property
    def shares(self) -> bool:
        """Its config asks for a sharing strategy."""
        config = self.config
        return isinstance(config, GpuConfig | MigDeviceConfig) and config.sharing is not None


@dataclass
class ClaimSharing:
    """What was done for one claim (the state file's content)."""

    time_sliced: list[str] = field(default_factory=list)
    """GPU UUIDs whose time slice was set."""
    daemons: list[dict[str, Any]] = field(default_factory=list)
    """MPS daemons started: ``{"id": ..., "gpus": [...]}``."""

    @property
    def empty(self) -> bool:
        return not (self.time_sliced or self.daemons)


class GpuTools:
    """NVML's compute mode and the driver's programs, as time-slicing and MPS use them.

    Args:
        open_nvml: opens NVML (closed after each use).
        driver_root: where this process sees the driver installation (``nvidia-smi`` and
            ``nvidia-cuda-mps-control`` are looked for there, then on ``PATH``).
        library: the NVML library under the driver root, preloaded by ``nvidia-smi`` as NVIDIA
            does (None: the system's).
    """

    def __init__(self, *, open_nvml: Callable[[], Nvml], driver_root: Path, library: Path | None) -> None:
        self.open_nvml = open_nvml
        self.driver_root = driver_root
        self.library = library

    def set_compute_mode(self, uuids: Sequence[str], mode: str) -> None:
        """NVML compute mode ``mode`` (``DEFAULT``, ``EXCLUSIVE_PROCESS``) on each GPU.

        Raises:
            SharingError: ``error setting compute mode: ...`` (NotSupportedError: NVML does not
                support it on a GPU).
        """
        try:
            with self.open_nvml() as nvml:
                value = nvml.const(f"NVML_COMPUTEMODE_{mode}")
                for uuid in uuids:
                    handle = nvml.call("nvmlDeviceGetHandleByUUID", uuid)
                    nvml.call("nvmlDeviceSetComputeMode", handle, value)
        except NvmlError as exc:
            error = NotSupportedError if exc.code == NOT_SUPPORTED else SharingError
            raise error(f"error setting compute mode: {exc}") from None

    def _reset_mode(self, gpus: list[str]) -> None:
        with contextlib.suppress(NotSupportedError):
            self.set_compute_mode(gpus, "DEFAULT")

    def _binary(self, name: str) -> str:
        for directory in BINARY_DIRS:
            candidate = self.driver_root / directory.lstrip("/") / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        found = shutil.which(name)
        if found is None:
            raise SharingError(f"{name} not found under the driver root {self.driver_root} or on PATH")
        return found


class MpsDaemons(GpuTools):
    """Starts and stops the claims' MPS control daemons under ``mps_dir``."""

    mps_dir: Path

    def _save(self, claim_uid: str, done: ClaimSharing) -> None:
        """Record ``done`` for the claim (before a daemon starts, so that it can be stopped)."""
        raise NotImplementedError

    def _start_daemon(
        self, claim_uid: str, group: SharingGroup, config: MpsConfig | None, done: ClaimSharing
    ) -> dict[str, ContainerEdits]:
        uuids = group.uuids
        ident = daemon_id(claim_uid, uuids)
        root = self.mps_dir / ident
        pipe, shm, logs = root / "pipe", root / "shm", root / "log"
        try:
            limits = pinned_limits(config, uuids) if config is not None else {}
            _check_limits(limits, group)
            commands = []
            if config is not None and config.default_active_thread_percentage is not None:
                commands.append(
                    f"set_default_active_thread_percentage {config.default_active_thread_percentage}"
                )
            commands += [
                f"set_default_device_pinned_mem_limit {u} {limit}" for u, limit in sorted(limits.items())
            ]
            control = self._binary(CONTROL_BINARY)
        except (OpaqueConfigError, SharingError) as exc:
            raise SharingError(f"error starting MPS control daemon: {exc}") from None
        done.daemons.append({"id": ident, "gpus": group.gpu_uuids})
        self._save(claim_uid, done)
        try:
            for directory in (shm, pipe, logs):
                directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            _mount_shm(shm)
            self.set_compute_mode(group.gpu_uuids, "EXCLUSIVE_PROCESS")
            env = self._daemon_env(uuids, logs)
            self._run(control, ["-d"], env, pipe)
            for command in commands:
                self._ask(control, pipe, command, env)
        except (OSError, SharingError) as exc:
            raise SharingError(f"error starting MPS control daemon: {exc}") from None
        self._wait_ready(control, pipe, env)
        log.info("mps_daemon_started", claim_uid=claim_uid, id=ident, devices=uuids, settings=commands)
        container = ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}",),
            mounts=(
                CdiMount(host_path=str(shm), container_path=CONTAINER_SHM_DIR, options=_MOUNT_OPTIONS),
                CdiMount(host_path=str(pipe), container_path=CONTAINER_PIPE_DIR, options=_MOUNT_OPTIONS),
            ),
        )
        return {name: container for name, _ in group.devices}

    def _daemon_env(self, uuids: Sequence[str], logs: Path) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        if self.library is not None:
            paths = [str(self.library.parent), os.environ.get("LD_LIBRARY_PATH", "")]
            env["LD_LIBRARY_PATH"] = ":".join(p for p in paths if p)
        return env

    def _run(self, control: str, args: list[str], env: dict[str, str], pipe: Path) -> None:
        full = {**os.environ, **env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
        try:
            result = subprocess.run(
                [control, *args], env=full, capture_output=True, timeout=_COMMAND_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            raise SharingError(
                f"{control} {' '.join(args)} did not return within {_COMMAND_TIMEOUT:g} s"
            ) from None
        _check(result, f"{control} {' '.join(args)}")

    def _ask(self, control: str, pipe: Path, command: str, env: dict[str, str]) -> str:
        try:
            result = control_command(control, pipe, command, env=env, timeout=_COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise SharingError(f"'{command}' got no answer within {_COMMAND_TIMEOUT:g} s") from None
        _check(result, f"'{command}'")
        return result.stdout.decode(errors="replace").strip()

    def _wait_ready(self, control: str, pipe: Path, env: dict[str, str]) -> None:
        for delay in (*_READY_DELAYS, None):
            try:
                self._ask(control, pipe, "get_default_active_thread_percentage", env)
                return
            except (OSError, SharingError) as exc:
                if delay is None:
                    raise SharingError(f"MPS control daemon is not yet ready: {exc}") from None
                time.sleep(delay)

    def _stop_daemon(self, claim_uid: str, daemon: Mapping[str, Any]) -> None:
        root = self.mps_dir / str(daemon["id"])
        if not root.exists():
            return
        pipe = root / "pipe"
        try:
            self._ask(self._binary(CONTROL_BINARY), pipe, "quit", {})
        except (OSError, SharingError) as exc:
            # Gone already (a reboot, or it died): nothing to stop.
            log.warning("mps_daemon_not_answering", claim_uid=claim_uid, id=daemon["id"], error=str(exc))
        shm = root / "shm"
        if os.path.ismount(shm):
            subprocess.run(["umount", str(shm)], capture_output=True, timeout=_COMMAND_TIMEOUT, check=False)
        shutil.rmtree(root)
        gpus = list(daemon.get("gpus") or [])
        if gpus:
            self._reset_mode(gpus)
        log.info("mps_daemon_stopped", claim_uid=claim_uid, id=daemon["id"])


def _check(result: subprocess.CompletedProcess[bytes], what: str) -> None:
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).decode(errors="replace").strip()
        raise SharingError(f"{what} exited {result.returncode}" + (f": {detail}" if detail else ""))


def _check_limits(limits: Mapping[str, str], group: SharingGroup) -> None:
    """A pinned-memory limit over a device's memory is refused (NVIDIA passes it on)."""
    memory = {r.uuid: r.memory_mib for _, r in group.devices}
    for uuid, limit in sorted(limits.items()):
        mib = int(limit.removesuffix("M"))
        if mib > memory[uuid]:
            raise SharingError(
                f"invalid limit: value set too high: {uuid}: {limit} is more than the device's memory "
                f"({memory[uuid]}M)"
            )


def _shm_size(meminfo: Path = Path("/proc/meminfo")) -> str:
    """Half of MemTotal, as NVIDIA sizes the tmpfs (``65536k`` when it cannot be read)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                parts = line.removeprefix("MemTotal:").split()
                return f"{int(parts[0]) // 2}{parts[1][0] if len(parts) > 1 else ''}"
    except (OSError, ValueError, IndexError):
        pass
    return "65536k"


def _mount_shm(shm: Path) -> None:
    """A tmpfs at ``shm`` when this process may mount one (root); else the directory stays."""
    if os.geteuid() != 0 or os.path.ismount(shm) or shutil.which("mount") is None:
        return
    options = f"rw,nosuid,nodev,noexec,relatime,size={_shm_size()}"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "shm", str(shm)],
        capture_output=True,
        timeout=_COMMAND_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        log.warning(
            "mps_shm_not_mounted",
            path=str(shm),
            error=result.stderr.decode(errors="replace").strip(),
            note="the MPS shared memory stays on the plugin directory's file system",
        )
