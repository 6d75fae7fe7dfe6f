"""Time-slicing and MPS for prepared claims, as NVIDIA's DRA driver v0.4.1 applies them.

Per group of a claim's devices (the devices one config applies to):

* ``TimeSlicing`` (full GPUs only; a ``MigDeviceConfig`` carries no interval and changes
  nothing): compute mode ``DEFAULT`` through NVML (``nvmlDeviceSetComputeMode``; NVIDIA runs
  ``nvidia-smi -i <uuid> -c DEFAULT``), then ``nvidia-smi compute-policy -i <uuid>
  --set-timeslice <0-3>`` from the driver root (NVML has no call for it); unprepare sets the
  ``Default`` interval again.
* ``MPS``: one ``nvidia-cuda-mps-control -d`` per group, run by this process (NVIDIA starts a
  Deployment that runs it), with its files in ``<plugin dir>/mps/<claim UID>-<5 hex of the
  sha256 of the sorted UUIDs>/{pipe,shm,log}`` (``shm`` a tmpfs of half the host's memory when
  this process may mount one); full GPUs go to ``EXCLUSIVE_PROCESS``; the thread percentage and
  pinned-memory limits are sent to the daemon, which must answer within ~15 s. Its containers
  get ``CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`` and the pipe and shm directories. Unprepare
  stops it and, beyond NVIDIA (whose GPUs stay ``EXCLUSIVE_PROCESS``), sets ``DEFAULT`` again.

What was done for a claim is kept in ``<plugin dir>/sharing/<claim UID>.json`` (only for claims
that share), so that an unprepare after a restart undoes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from devplug.cdi import CdiMount, ContainerEdits
from devplug.errors import DevplugError
from devplug_nvidia._cdi_driver import BINARY_DIRS
from devplug_nvidia._dra_config import (
    INTERVALS,
    MPS,
    TIME_SLICING,
    GpuConfig,
    GpuSharing,
    MigDeviceConfig,
    MpsConfig,
    OpaqueConfigError,
    group_results,
    opaque_configs,
    pinned_limits,
    prepared_config,
)
from devplug_nvidia._feature_gates import MPS_SUPPORT, TIME_SLICING_SETTINGS
from devplug_nvidia._mps import CONTROL_BINARY, control_command
from devplug_nvidia._nvml import NOT_SUPPORTED, NvmlError, find_library

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug.cdi import CdiSpec
    from devplug.models import AllocatedDevice, Claim, OpaqueConfig
    from devplug_nvidia._dra_config import Config
    from devplug_nvidia._model import GpuRecord
    from devplug_nvidia._nvml import Nvml
    from devplug_nvidia.config import NvidiaSettings
    from devplug_nvidia.discovery import NvmlSource

__all__ = [
    "CONTAINER_PIPE_DIR",
    "ClaimSharing",
    "SharingError",
    "SharingGroup",
    "SharingManager",
    "daemon_id",
]

log = structlog.get_logger("devplug_nvidia.dra")

CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"  # noqa: S108 - where NVIDIA's containers find the MPS pipes
CONTAINER_SHM_DIR = "/dev/shm"  # noqa: S108 - the container's shared memory, backed by the daemon's
NVIDIA_SMI = "nvidia-smi"
_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
_READY_DELAYS = (1.0, 2.0, 4.0, 8.0)  # NVIDIA's backoff while it waits for its daemon (~15 s)
_COMMAND_TIMEOUT = 10.0


class SharingError(DevplugError):
    """Sharing could not be applied or undone; the message is NVIDIA's where it has one."""


class NotSupportedError(SharingError):
    """NVML does not support the setting on this GPU."""


def plan(
    driver: str,
    claim: Claim,
    devices: Sequence[AllocatedDevice],
    given: Sequence[OpaqueConfig],
    *,
    record_of: Callable[[str], GpuRecord],
    gates: Mapping[str, bool],
    type_of: Callable[[str], str] | None = None,
) -> list[SharingGroup]:
    """The claim's groups: its configs decoded, matched to its devices, normalized and checked
    (nothing is applied). ``record_of``: device name → record; ``type_of``: device name → the
    type NVIDIA names in messages (default: the record's kind, ``gpu`` or ``mig``).

    Raises:
        OpaqueConfigError: NVIDIA's message for the first problem.
    """
    entries = opaque_configs(driver, claim.resource_claim, given)
    groups = group_results(entries, devices, type_of or (lambda name: record_of(name).kind))
    return [
        SharingGroup(
            prepared_config(group.config, gates),
            tuple(d.request for d in group.devices),
            tuple((d.name, record_of(d.name)) for d in group.devices),
        )
        for group in groups
    ]


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


class SharingManager:
    """Applies and undoes the sharing of claims (called under the driver's lock, in a thread).

    Args:
        gates: the feature gates.
        open_nvml: opens NVML (closed after each use).
        driver_root: where this process sees the driver installation (``nvidia-smi`` and
            ``nvidia-cuda-mps-control`` are looked for there, then on ``PATH``).
        library: the NVML library under the driver root, preloaded by ``nvidia-smi`` as NVIDIA
            does (None: the system's).
        plugin_dir: the driver's directory (``mps/`` and ``sharing/`` go there).
    """

    def __init__(
        self,
        *,
        gates: Mapping[str, bool],
        open_nvml: Callable[[], Nvml],
        driver_root: Path,
        library: Path | None,
        plugin_dir: Path,
    ) -> None:
        self.gates = gates
        self.open_nvml = open_nvml
        self.driver_root = driver_root
        self.library = library
        self.mps_dir = plugin_dir / "mps"
        self.state_dir = plugin_dir / "sharing"

    # -- prepare ---------------------------------------------------------------------------------

    def apply(self, claim_uid: str, groups: Sequence[SharingGroup]) -> dict[str, ContainerEdits]:
        """Apply each group's sharing; the extra container edits by device name.

        Whatever an earlier, failed attempt left for the claim is undone first; on failure,
        what this call did is undone.

        Raises:
            SharingError: ``error applying config: ...`` (NVIDIA's texts).
        """
        self.undo(claim_uid)
        done = ClaimSharing()
        edits: dict[str, ContainerEdits] = {}
        try:
            for group in groups:
                try:
                    edits.update(self._apply_group(claim_uid, group, done))
                except (SharingError, OpaqueConfigError) as exc:
                    raise SharingError(f"error applying config: {exc}") from None
        except BaseException:
            with contextlib.suppress(SharingError, OSError):
                self._undo(claim_uid, done)
            self._forget(claim_uid)
            raise
        return edits

    def _apply_group(
        self, claim_uid: str, group: SharingGroup, done: ClaimSharing
    ) -> dict[str, ContainerEdits]:
        config = group.config
        sharing = config.sharing if isinstance(config, GpuConfig | MigDeviceConfig) else None
        if sharing is None:
            return {}
        requests = "[" + " ".join(group.requests) + "]"
        if self.gates.get(TIME_SLICING_SETTINGS) and sharing.strategy == TIME_SLICING:
            if not isinstance(sharing, GpuSharing):
                return {}  # NVIDIA: no time-slicing settings for MIG devices, nothing to do
            where = f"for requests '{requests}' in claim '{claim_uid}'"
            if sharing.mps_config is not None:
                raise SharingError(
                    f"error getting timeslice config {where}: cannot use MpsConfig with the "
                    f"'{TIME_SLICING}' strategy"
                )
            assert sharing.time_slicing_config is not None  # normalized
            interval = INTERVALS[sharing.time_slicing_config.interval or "Default"]
            uuids = group.gpu_uuids
            done.time_sliced += uuids
            self._save(claim_uid, done)
            try:
                self.set_time_slice(uuids, interval)
            except SharingError as exc:
                raise SharingError(f"error setting timeslice config {where}: {exc}") from None
            log.info("time_slice_set", claim_uid=claim_uid, gpus=uuids, interval=interval)
            return {}
        if self.gates.get(MPS_SUPPORT) and sharing.strategy == MPS:
            if isinstance(sharing, GpuSharing) and sharing.time_slicing_config is not None:
                raise SharingError(
                    f"error getting MPS configuration: cannot use TimeSlicingConfig with the '{MPS}' strategy"
                )
            return self._start_daemon(claim_uid, group, sharing.mps_config, done)
        return {}

    # -- time-slicing ----------------------------------------------------------------------------

    def set_time_slice(self, uuids: Sequence[str], interval: int) -> None:
        """Compute mode DEFAULT, then the time slice, on each GPU.

        Raises:
            SharingError: ``error setting compute mode: ...`` or ``error setting time slice: ...``.
        """
        if not uuids:
            return
        self.set_compute_mode(uuids, "DEFAULT")
        tool = self._binary(NVIDIA_SMI)
        env = dict(os.environ)
        if self.library is not None:
            env["LD_PRELOAD"] = ":".join(p for p in (str(self.library), env.get("LD_PRELOAD", "")) if p)
        for uuid in uuids:
            command = [tool, "compute-policy", "-i", uuid, "--set-timeslice", str(interval)]
            try:
                result = subprocess.run(
                    command, env=env, capture_output=True, timeout=_COMMAND_TIMEOUT, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SharingError(f"error setting time slice: error running nvidia-smi: {exc}") from None
            if result.returncode != 0:
                output = (result.stdout + result.stderr).decode(errors="replace").strip()
                raise SharingError(
                    f"error setting time slice: error running nvidia-smi: exit status {result.returncode}"
                    + (f": {output}" if output else "")
                )

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

    # -- MPS -------------------------------------------------------------------------------------

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

    # -- unprepare -------------------------------------------------------------------------------

    def undo(self, claim_uid: str) -> None:
        """Undo what was done for the claim (nothing when nothing was).

        Raises:
            SharingError: a daemon could not be stopped or a time slice reset; the state is kept
                for the next try.
        """
        done = self._load(claim_uid)
        if done is None:
            return
        self._undo(claim_uid, done)
        self._forget(claim_uid)

    def _undo(self, claim_uid: str, done: ClaimSharing) -> None:
        for daemon in done.daemons:
            try:
                self._stop_daemon(claim_uid, daemon)
            except (OSError, subprocess.SubprocessError) as exc:
                raise SharingError(f"error stopping MPS control daemon: {exc}") from None
        if done.time_sliced:
            try:
                self.set_time_slice(done.time_sliced, INTERVALS["Default"])
            except NotSupportedError:
                log.warning("time_slice_reset_not_supported", claim_uid=claim_uid, gpus=done.time_sliced)
            except SharingError as exc:
                raise SharingError(f"error setting timeslice for devices: {exc}") from None

    def _reset_mode(self, gpus: list[str]) -> None:
        with contextlib.suppress(NotSupportedError):
            self.set_compute_mode(gpus, "DEFAULT")

    # -- helpers ---------------------------------------------------------------------------------

    def _binary(self, name: str) -> str:
        for directory in BINARY_DIRS:
            candidate = self.driver_root / directory.lstrip("/") / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        found = shutil.which(name)
        if found is None:
            raise SharingError(f"{name} not found under the driver root {self.driver_root} or on PATH")
        return found

    def _state_file(self, claim_uid: str) -> Path:
        return self.state_dir / f"{claim_uid}.json"

    def _save(self, claim_uid: str, done: ClaimSharing) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self._state_file(claim_uid)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(done)))
        temporary.replace(path)

    def _load(self, claim_uid: str) -> ClaimSharing | None:
        try:
            data = json.loads(self._state_file(claim_uid).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SharingError(f"the sharing state of claim {claim_uid} cannot be read: {exc}") from None
        return ClaimSharing(
            time_sliced=list(data.get("time_sliced", [])), daemons=list(data.get("daemons", []))
        )

    def _forget(self, claim_uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._state_file(claim_uid).unlink()


def sharing_manager(config: NvidiaSettings, source: NvmlSource, plugin_dir: Path) -> SharingManager:
    """The manager for a plugin with ``config``, NVML from ``source``, files under ``plugin_dir``."""
    from devplug_nvidia._cdi import driver_view

    library = None
    if source.module is None and Path(source.driver_root) != Path("/"):
        with contextlib.suppress(NvmlError):
            library = find_library(source.driver_root)
    return SharingManager(
        gates=config.gates,
        open_nvml=source.open,
        driver_root=Path(driver_view(config)),
        library=library,
        plugin_dir=plugin_dir,
    )


def with_device_edits(spec: CdiSpec, claim_uid: str, extra: Mapping[str, ContainerEdits]) -> CdiSpec:
    """``spec`` with the ``extra`` edits (by device name) added to its claim devices."""
    devices = []
    for device in spec.devices:
        more = extra.get(device.name.removeprefix(f"{claim_uid}-"))
        edits = device.container_edits
        if more is not None:
            edits = edits.model_copy(
                update={"env": edits.env + more.env, "mounts": edits.mounts + more.mounts}
            )
        devices.append(device.model_copy(update={"container_edits": edits}))
    return spec.model_copy(update={"devices": tuple(devices)})


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
