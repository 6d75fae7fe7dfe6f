"""Time-slicing and MPS for prepared claims, as NVIDIA's DRA driver v0.4.1 applies them.

Per group of a claim's devices (the devices one config applies to):

* ``TimeSlicing`` (full GPUs only; a ``MigDeviceConfig`` carries no interval and changes
  nothing): compute mode ``DEFAULT`` through NVML (``nvmlDeviceSetComputeMode``; NVIDIA runs
  ``nvidia-smi -i <uuid> -c DEFAULT``), then ``nvidia-smi compute-policy -i <uuid>
  --set-timeslice <0-3>`` from the driver root (NVML has no call for it); unprepare sets the
  ``Default`` interval again.
* ``MPS``: one control daemon per group (:mod:`devplug_nvidia._dra._mps`); its containers get
  ``CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`` and the daemon's pipe and shm directories.
  Unprepare stops it.

What was done for a claim is kept in ``<plugin dir>/sharing/<claim UID>.json`` (only for claims
that share), so that an unprepare after a restart undoes it.

With consumable shares (NVIDIA v0.5.0), a GPU serves several claims: MPS is refused (``MPS
sharing is not supported when consumable shares is enabled``), and a GPU's time slice is reset
only when its last claim goes (:meth:`SharingManager.release_gpu`, from the plugin's
``release_device``), as NVIDIA skips the reset while other claims use the GPU; a file
``<plugin dir>/sharing/time-slice-<GPU UUID>`` marks a time slice set for such a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from devplug_nvidia._config._feature_gates import MPS_SUPPORT, TIME_SLICING_SETTINGS
from devplug_nvidia._dra._config import (
    INTERVALS,
    MPS,
    TIME_SLICING,
    GpuConfig,
    GpuSharing,
    MigDeviceConfig,
    OpaqueConfigError,
)
from devplug_nvidia._dra._groups import group_results, opaque_configs, prepared_config
from devplug_nvidia._dra._mps import (
    CONTAINER_PIPE_DIR,
    ClaimSharing,
    MpsDaemons,
    NotSupportedError,
    SharingError,
    SharingGroup,
    daemon_id,
)
from devplug_nvidia._gpu._nvml import NvmlError, find_library

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug.cdi import CdiSpec, ContainerEdits
    from devplug.models import AllocatedDevice, Claim, OpaqueConfig
    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia._gpu._nvml import Nvml
    from devplug_nvidia.config import NvidiaSettings
    from devplug_nvidia.discovery import NvmlSource

__all__ = [
    "CONTAINER_PIPE_DIR",
    "ClaimSharing",
    "NotSupportedError",
    "SharingError",
    "SharingGroup",
    "SharingManager",
    "daemon_id",
    "plan",
    "sharing_manager",
    "with_device_edits",
]

log = structlog.get_logger("devplug_nvidia.dra")

NVIDIA_SMI = "nvidia-smi"
_COMMAND_TIMEOUT = 10.0


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


class SharingManager(MpsDaemons):
    """Applies and undoes the sharing of claims (called under the driver's lock, in a thread).

    Args:
        gates: the feature gates.
        open_nvml: opens NVML (closed after each use).
        driver_root: where this process sees the driver installation (``nvidia-smi`` and
            ``nvidia-cuda-mps-control`` are looked for there, then on ``PATH``).
        library: the NVML library under the driver root, preloaded by ``nvidia-smi`` as NVIDIA
            does (None: the system's).
        plugin_dir: the driver's directory (``mps/`` and ``sharing/`` go there).
        consumable: consumable shares are on (GPUs are shared by claims).
    """

    def __init__(
        self,
        *,
        gates: Mapping[str, bool],
        open_nvml: Callable[[], Nvml],
        driver_root: Path,
        library: Path | None,
        plugin_dir: Path,
        consumable: bool = False,
    ) -> None:
        super().__init__(open_nvml=open_nvml, driver_root=driver_root, library=library)
        self.gates = gates
        self.mps_dir = plugin_dir / "mps"
        self.state_dir = plugin_dir / "sharing"
        self.consumable = consumable

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
            # Undone now if possible; else the state file stays and the kubelet's next prepare
            # of the claim tries again (a failed claim is never unprepared).
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
            if self.consumable:
                self._mark_time_sliced(uuids)  # reset when the GPU's last claim goes
            else:
                done.time_sliced += uuids
                self._save(claim_uid, done)
            try:
                self.set_time_slice(uuids, interval)
            except SharingError as exc:
                raise SharingError(f"error setting timeslice config {where}: {exc}") from None
            log.info("time_slice_set", claim_uid=claim_uid, gpus=uuids, interval=interval)
            return {}
        if self.gates.get(MPS_SUPPORT) and sharing.strategy == MPS:
            if self.consumable:
                raise SharingError("MPS sharing is not supported when consumable shares is enabled")
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

    def release_gpu(self, uuid: str) -> None:
        """The GPU's last claim is gone (consumable shares): reset its time slice if a claim set
        one (nothing otherwise; idempotent).

        Raises:
            SharingError: the time slice could not be reset; the mark is kept for the next try.
        """
        marker = self._time_slice_marker(uuid)
        if not marker.exists():
            return
        try:
            self.set_time_slice([uuid], INTERVALS["Default"])
        except NotSupportedError:
            log.warning("time_slice_reset_not_supported", gpus=[uuid])
        except SharingError as exc:
            raise SharingError(f"error setting timeslice for devices: {exc}") from None
        marker.unlink(missing_ok=True)

    def _mark_time_sliced(self, uuids: Sequence[str]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for uuid in uuids:
            self._time_slice_marker(uuid).touch()

    def _time_slice_marker(self, uuid: str) -> Path:
        return self.state_dir / f"time-slice-{uuid}"

    # -- helpers ---------------------------------------------------------------------------------

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
    from devplug_nvidia._container._cdi import driver_view

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
        consumable=config.shares is not None,
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
