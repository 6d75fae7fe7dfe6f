"""Discovery: NVML → one :class:`GpuRecord` per full GPU and per MIG device, then resources.

:func:`discover_devices` walks NVML (nvidia.md §2, §7); :func:`apply_mig_strategy` groups the
records into resources; :func:`discover` does both from the plugin's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from devplug.topology import normalize_pci_bus_id, pci_numa_node
from devplug_nvidia._discovery._details import (
    SystemVersions,
    gpu_details,
    gpu_instance_details,
    profile_table,
    system_versions,
)
from devplug_nvidia._discovery._mig import mig_cap_paths, mig_memory_gb, mig_profile_name, read_mig_minors
from devplug_nvidia._discovery._strategy import (
    GPU_RESOURCE,
    MigStrategy,
    MigStrategyError,
    apply_mig_strategy,
    apply_naming,
    check_sharing,
    mig_resource_name,
)
from devplug_nvidia._gpu import _nvml
from devplug_nvidia._gpu._model import GpuRecord, MigInfo
from devplug_nvidia._gpu._nvml import Nvml, NvmlError

if TYPE_CHECKING:
    import os

__all__ = [
    "GPU_RESOURCE",
    "DiscoverySettings",
    "InitStatus",
    "MigStrategy",
    "MigStrategyError",
    "NvmlSource",
    "apply_mig_strategy",
    "check_sharing",
    "discover",
    "discover_devices",
    "discover_or_idle",
    "mig_memory_gb",
    "mig_profile_name",
    "mig_resource_name",
    "nvml_source",
    "read_mig_minors",
]

log = structlog.get_logger(__name__)
_MIB = 1024 * 1024
_NOT_MIG_CAPABLE = (_nvml.NOT_SUPPORTED, _nvml.FUNCTION_NOT_FOUND)
_EMPTY_SLOT = (_nvml.NOT_FOUND, _nvml.INVALID_ARGUMENT)


class DiscoverySettings(Protocol):
    """What :func:`discover` reads from the plugin's settings."""

    @property
    def mig_strategy(self) -> MigStrategy: ...
    @property
    def driver_root(self) -> str: ...
    @property
    def fake_nvml(self) -> str | None: ...


def _text(value: str | bytes) -> str:
    # Real pynvml returns bytes from some calls (PCI bus IDs) and str from others.
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class NvmlSource:
    """Where NVML comes from for the settings: the real library, or a fake machine model whose
    ``sys`` and ``proc`` trees lie under the driver root."""

    module: Any
    """The pynvml-like module (None: the real ``pynvml``)."""
    sysfs: Path
    proc: Path
    driver_root: str

    def open(self) -> Nvml:
        """Open NVML (close it, or use it as a context manager). Raises NvmlError."""
        return Nvml.open(self.module, driver_root=self.driver_root)


def nvml_source(
    settings: DiscoverySettings,
    *,
    module: Any = None,
    sysfs: str | os.PathLike[str] | None = None,
    proc: str | os.PathLike[str] | None = None,
) -> NvmlSource:
    """The NVML to use: ``module`` if given, else the fake model ``settings.fake_nvml``, else pynvml.

    Raises:
        NvmlError: the fake model name is unknown.
    """
    root = Path(settings.driver_root)
    if module is None and settings.fake_nvml:
        from devplug_nvidia.testing import fake_nvml

        try:
            module = fake_nvml(settings.fake_nvml)
        except KeyError as exc:
            raise NvmlError(str(exc.args[0]), code=_nvml.NOT_FOUND) from None
        sysfs = root / "sys" if sysfs is None else sysfs
        proc = root / "proc" if proc is None else proc
        # The fake "kernel driver" shows the MIG instances it creates (dynamic MIG) as capability
        # files there, as the real one does under /proc/driver/nvidia/capabilities.
        module.proc_root = Path(proc)
    return NvmlSource(module, Path(sysfs or "/sys"), Path(proc or "/proc"), library_root(settings))


def library_root(settings: DiscoverySettings) -> str:
    """Where this process finds the driver's libraries.

    ``--driver-root`` is the host's path; in a container the host driver root is mounted at
    ``--driver-root-ctr-path`` (default ``/driver-root``), so the library is loaded from there
    when that directory exists, and from the driver root itself otherwise (a plugin on the host,
    or the fake NVML whose tree lies under the driver root).
    """
    container_root = getattr(settings, "driver_root_ctr_path", None)
    if settings.driver_root != "/" and container_root and Path(container_root).is_dir():
        return str(container_root)
    return settings.driver_root


def discover(
    settings: DiscoverySettings,
    *,
    module: Any = None,
    sysfs: str | os.PathLike[str] | None = None,
    proc: str | os.PathLike[str] | None = None,
) -> dict[str, list[GpuRecord]]:
    """Resource name → records for the plugin's settings (NVML opened and closed here).

    With ``settings.fake_nvml`` set (and no ``module``), NVML is the fake machine model of that
    name, and ``sys`` / ``proc`` are read under the driver root (where
    :func:`devplug_nvidia.testing.write_root` puts them).

    Raises:
        NvmlError: NVML could not start or a call failed; the message says what to check.
        MigStrategyError: the MIG strategy does not fit the machine (a ``ConfigError``).
    """
    source = nvml_source(settings, module=module, sysfs=sysfs, proc=proc)
    with source.open() as nvml:
        records = discover_devices(nvml, sysfs=source.sysfs, proc=source.proc)
    resources = apply_naming(
        apply_mig_strategy(records, settings.mig_strategy), getattr(settings, "resources", None)
    )
    sharing = getattr(settings, "sharing", None)
    if sharing is not None:
        check_sharing(resources, sharing.strategy)
    return resources


@dataclass
class InitStatus:
    """Whether start-up found the devices, and if not why: what a readiness check reports.

    The process keeps one; :func:`discover_or_idle` fills it in. ``ready`` False with a
    ``reason`` is the ``fail-on-init-error=false`` idle state (up, advertising nothing).
    """

    ready: bool = False
    """Discovery succeeded (possibly finding no devices)."""
    reason: str | None = None
    """Why not ready (the NVML error, saying what to check); None when ready or not started."""

    def mark_ready(self) -> None:
        self.ready, self.reason = True, None

    def mark_failed(self, reason: str) -> None:
        self.ready, self.reason = False, reason


def discover_or_idle(
    settings: DiscoverySettings, status: InitStatus, **kwargs: Any
) -> dict[str, list[GpuRecord]]:
    """:func:`discover`, honouring ``fail-on-init-error``: when false, an NVML failure leaves
    ``status`` not ready with the reason, is logged once, and nothing is advertised.

    Raises:
        NvmlError: NVML failed and ``settings.fail_on_init_error`` is true (the default).
        MigStrategyError: the configuration does not fit the machine (always fatal: exit 2).
    """
    try:
        resources = discover(settings, **kwargs)
    except NvmlError as exc:
        if getattr(settings, "fail_on_init_error", True):
            status.mark_failed(str(exc))
            raise
        status.mark_failed(str(exc))
        log.warning("init_failed_idle", reason=str(exc), advertising="nothing", fail_on_init_error=False)
        return {}
    status.mark_ready()
    return resources


def discover_devices(
    nvml: Nvml,
    *,
    sysfs: str | os.PathLike[str] = "/sys",
    proc: str | os.PathLike[str] = "/proc",
    details: bool = False,
) -> list[GpuRecord]:
    """Every full GPU (MIG-enabled or not), then the MIG devices of each, in NVML index order.

    A GPU that reports GPU_IS_LOST is left out with a warning rather than failing the node.
    ``details``: also read what DRA publishes (:attr:`GpuRecord.details`,
    :attr:`MigInfo.gpu_instance`), which NVIDIA's DRA driver requires of every GPU.

    Raises:
        NvmlError: an NVML call failed.
    """
    records: list[GpuRecord] = []
    minors: dict[str, int] | None = None
    system = system_versions(nvml) if details else None
    for index in range(nvml.call("nvmlDeviceGetCount")):
        try:
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            gpu = _gpu_record(nvml, handle, index, sysfs, system)
        except NvmlError as exc:
            if exc.code != _nvml.GPU_IS_LOST:
                raise
            log.warning("gpu_lost_skipped", gpu=index, error=str(exc))
            continue
        records.append(gpu)
        if gpu.mig_enabled:
            if minors is None:
                minors = read_mig_minors(proc) or {}
            records.extend(_mig_records(nvml, handle, gpu, minors, details=details))
    return records


def _gpu_record(
    nvml: Nvml, handle: Any, index: int, sysfs: str | os.PathLike[str], system: SystemVersions | None
) -> GpuRecord:
    bus_id = normalize_pci_bus_id(_text(nvml.call("nvmlDeviceGetPciInfo", handle).busId))
    major, minor_cc = nvml.call("nvmlDeviceGetCudaComputeCapability", handle)
    memory = int(nvml.call("nvmlDeviceGetMemoryInfo", handle).total)
    return GpuRecord(
        kind="gpu",
        index=str(index),
        uuid=_text(nvml.call("nvmlDeviceGetUUID", handle)),
        minor=int(nvml.call("nvmlDeviceGetMinorNumber", handle)),
        name=_text(nvml.call("nvmlDeviceGetName", handle)),
        memory_mib=memory // _MIB,
        bus_id=bus_id,
        numa_node=pci_numa_node(bus_id, sysfs=sysfs),
        compute_capability=(int(major), int(minor_cc)),
        mig_enabled=_mig_enabled(nvml, handle),
        details=None
        if system is None
        else gpu_details(
            nvml, handle, index=index, bus_id=bus_id, memory_bytes=memory, system=system, sysfs=sysfs
        ),
    )


def _mig_enabled(nvml: Nvml, handle: Any) -> bool:
    try:
        current, _pending = nvml.call("nvmlDeviceGetMigMode", handle)
    except NvmlError as exc:
        if exc.code in _NOT_MIG_CAPABLE:
            return False
        raise
    return bool(current == nvml.const("NVML_DEVICE_MIG_ENABLE"))


def _mig_records(
    nvml: Nvml, parent: Any, gpu: GpuRecord, minors: dict[str, int], *, details: bool = False
) -> list[GpuRecord]:
    parent_bytes = int(nvml.call("nvmlDeviceGetMemoryInfo", parent).total)
    # The GPU's profiles: NVML names an instance's profile by its ID, the names go by the index.
    profiles = profile_table(nvml, parent)
    records = []
    for slot in range(nvml.call("nvmlDeviceGetMaxMigDeviceCount", parent)):
        try:
            handle = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", parent, slot)
        except NvmlError as exc:
            if exc.code in _EMPTY_SLOT:
                continue
            raise
        attrs = nvml.call("nvmlDeviceGetAttributes", handle)
        gi = int(nvml.call("nvmlDeviceGetGpuInstanceId", handle))
        ci = int(nvml.call("nvmlDeviceGetComputeInstanceId", handle))
        instance = gpu_instance_details(nvml, parent, gi, profiles, attrs) if details else None
        profile = mig_profile_name(
            gpu_slices=int(attrs.gpuInstanceSliceCount),
            compute_slices=int(attrs.computeInstanceSliceCount),
            memory_mb=int(attrs.memorySizeMB),
            parent_memory_bytes=parent_bytes,
            # The suffix goes by the profile's index, not by the ID NVML reports for the
            # instance (19 is 1g.10gb on an A100 80GB, whose index is 0).
            gi_profile_id=_gi_profile_index(nvml, parent, gi, profiles)
            if instance is None
            else instance.profile_index,
        )
        try:
            caps = mig_cap_paths(minors, gpu.minor, gi, ci)
        except KeyError:
            log.warning("mig_caps_not_found", gpu=gpu.index, gpu_instance=gi, compute_instance=ci)
            caps = ()
        records.append(
            GpuRecord(
                kind="mig",
                index=f"{gpu.index}:{slot}",
                uuid=_text(nvml.call("nvmlDeviceGetUUID", handle)),
                minor=gpu.minor,
                name=gpu.name,
                memory_mib=int(attrs.memorySizeMB),
                bus_id=gpu.bus_id,
                numa_node=gpu.numa_node,
                compute_capability=gpu.compute_capability,
                mig=MigInfo(
                    parent_uuid=gpu.uuid,
                    parent_index=int(gpu.index),
                    parent_minor=gpu.minor,
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                    profile=profile,
                    cap_paths=caps,
                    gpu_instance=instance,
                ),
                details=gpu.details,
            )
        )
    return records


def _gi_profile_index(nvml: Nvml, parent: Any, gi: int, profiles: dict[int, Any]) -> int | None:
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` index of GPU instance ``gi``'s profile.

    The index carries the +me / +gfx / -me attributes; NVML reports the instance's profile by
    its ID, found again among ``profiles``. Without it (no permission to look up instances) the
    name is the plain ``<G>g.<GB>gb``.
    """
    try:
        instance = nvml.call("nvmlDeviceGetGpuInstanceById", parent, gi)
        profile_id = int(nvml.call("nvmlGpuInstanceGetInfo", instance).profileId)
    except NvmlError as exc:
        log.warning("mig_gpu_instance_unreadable", gpu_instance=gi, error=str(exc))
        return None
    return next((index for index, p in sorted(profiles.items()) if int(p.id) == profile_id), None)
