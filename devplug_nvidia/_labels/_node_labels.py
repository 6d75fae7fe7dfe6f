"""Node feature labels as gpu-feature-discovery computes them, and the atomic features-file write.

:func:`node_labels` reads NVML (through discovery's records) and the config and returns the
labels of nvidia.md §8; :func:`write_labels` writes them as ``key=value`` lines atomically (a
temporary file in the same directory, renamed over the features file), so Node Feature Discovery
never reads half a file. The ``labels`` command around them is :mod:`devplug_nvidia.labels`.

Where upstream is weak this does better: a missing PCI class file gives ``gpu.mode=unknown``
instead of failing, MPS on MIG gives ``mps.capable=false`` with a warning instead of exiting,
per-resource ``rename`` is honoured, and the labels of several GPU models on one node are chosen
deterministically (the lowest-index GPU's model wins).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from devplug_nvidia._config._file import Sharing
from devplug_nvidia._discovery._strategy import GPU_RESOURCE, MigStrategy, mig_resource_name
from devplug_nvidia._gpu import _nvml
from devplug_nvidia._gpu._nvml import Nvml, NvmlError
from devplug_nvidia.discovery import discover_devices

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug_nvidia._config._file import ReplicaResource
    from devplug_nvidia._gpu._model import GpuRecord

__all__ = [
    "DEFAULT_MACHINE_TYPE_FILE",
    "DEFAULT_OUTPUT_FILE",
    "DEFAULT_SLEEP_INTERVAL",
    "LabelSettings",
    "arch_family",
    "format_labels",
    "machine_labels",
    "node_labels",
    "read_node_labels",
    "sanitise",
    "write_labels",
]

log = structlog.get_logger(__name__)

DEFAULT_OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
DEFAULT_SLEEP_INTERVAL = 60.0
_NOT_MIG_CAPABLE = (_nvml.NOT_SUPPORTED, _nvml.FUNCTION_NOT_FOUND)
_PCI_MODES = {"0x030000": "graphics", "0x030200": "compute"}
_MIG_ATTRIBUTES = {
    "multiprocessors": "multiprocessorCount",
    "slices.gi": "gpuInstanceSliceCount",
    "slices.ci": "computeInstanceSliceCount",
    "engines.copy": "sharedCopyEngineCount",
    "engines.decoder": "sharedDecoderCount",
    "engines.encoder": "sharedEncoderCount",
    "engines.jpeg": "sharedJpegCount",
    "engines.ofa": "sharedOfaCount",
}


@dataclass(frozen=True)
class LabelSettings:
    """What the labels command does (gpu-feature-discovery's options)."""

    mig_strategy: MigStrategy = "none"
    """How MIG devices are labelled: none, single or mixed (as the device plugin advertises them)."""
    fail_on_init_error: bool = True
    """Exit when NVML cannot start; false: write only the labels that need no GPU."""
    oneshot: bool = False
    """Label once and exit."""
    no_timestamp: bool = False
    """Leave out ``nvidia.com/gfd.timestamp``."""
    sleep_interval: float = DEFAULT_SLEEP_INTERVAL
    """Seconds between two labelings."""
    output_file: str = DEFAULT_OUTPUT_FILE
    """The NFD features file; empty: print to standard output."""
    machine_type_file: str = DEFAULT_MACHINE_TYPE_FILE
    """DMI product name of the node (``nvidia.com/gpu.machine``)."""
    driver_root: str = "/"
    """Root of the NVIDIA driver installation (where libnvidia-ml.so.1 is found)."""
    fake_nvml: str | None = None
    """Label a fake NVML machine model instead (testing); sys and proc are read under the driver root."""
    sharing: Sharing = field(default_factory=Sharing)
    """``sharing`` of the config file (time-slicing or MPS replicas)."""


# -- the labels ----------------------------------------------------------------------------------


def sanitise(text: str) -> str:
    """Upstream's product-name rule: drop characters outside ``[A-Za-z0-9-_. ]``, spaces → ``-``."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def arch_family(major: int, minor: int) -> str:
    """The architecture family of a CUDA compute capability (``undefined`` when unknown)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}.get(
        major, "blackwell" if major in (10, 12) else "undefined"
    )


@dataclass(frozen=True)
class _Gpu:
    record: GpuRecord
    mig_capable: bool
    pci_class: str | None


@dataclass(frozen=True)
class _Resource:
    """One labelled resource: ``<name>.<suffix>`` keys, with the sharing config that applies."""

    name: str
    sharing: Sharing | None
    """None: sharing disabled for it (MIG-enabled GPUs), replicas 0."""

    def replication(self) -> ReplicaResource | None:
        section = None if self.sharing is None else self.sharing.section
        if section is None:
            return None
        return next((r for r in section.resources if r.name == self.name), None)

    def replicas(self) -> int:
        if self.sharing is None:
            return 0
        info = self.replication()
        return info.replicas if info is not None and info.replicas > 0 else 1

    def product(self, *parts: str) -> str:
        kept = [sanitise(p) for p in parts if p]
        info = self.replication()
        section = None if self.sharing is None else self.sharing.section
        renamed = info is not None and (
            info.rename is not None or (section is not None and section.rename_by_default)
        )
        if info is not None and info.replicas > 1 and not renamed:
            kept.append("SHARED")
        return "-".join(kept)

    def base(self, count: int, *parts: str) -> dict[str, str]:
        replicas = self.replicas()
        strategy = self.sharing.strategy if self.sharing is not None and replicas > 1 else "none"
        return self.keys(
            product=self.product(*parts), count=count, replicas=replicas, **{"sharing-strategy": strategy}
        )

    def keys(self, **values: object) -> dict[str, str]:
        return {f"{self.name}.{k}": str(v) for k, v in values.items()}


def _gpu_labels(resource: _Resource, gpu: GpuRecord, count: int) -> dict[str, str]:
    labels = resource.base(count, gpu.name)
    if gpu.memory_mib:
        labels |= resource.keys(memory=gpu.memory_mib)
    major, minor = gpu.compute_capability
    if major:
        labels |= resource.keys(
            family=arch_family(major, minor), **{"compute.major": major, "compute.minor": minor}
        )
    return labels


def _full_gpu_labels(gpus: Sequence[_Gpu], sharing: Sharing) -> dict[str, str]:
    """``nvidia.com/gpu.*`` from every GPU (MIG-enabled ones too, without sharing), as upstream."""
    counts: dict[str, int] = {}
    first: dict[tuple[bool, str], GpuRecord] = {}
    for gpu in gpus:
        counts[gpu.record.name] = counts.get(gpu.record.name, 0) + 1
        first.setdefault((gpu.record.mig_enabled, gpu.record.name), gpu.record)
    if len(counts) > 1:
        log.warning("multiple_gpu_models", models=list(counts))
    labels: dict[str, str] = {}
    # Full GPUs override MIG-enabled ones; the lowest-index GPU's model is applied last (wins).
    for mig_enabled in (True, False):
        resource = _Resource(GPU_RESOURCE, None if mig_enabled else sharing)
        for (enabled, name), record in reversed(first.items()):
            if enabled == mig_enabled:
                labels |= _gpu_labels(resource, record, counts[name])
    return labels


def _mig_labels(
    nvml: Nvml, gpus: Sequence[_Gpu], migs: Sequence[GpuRecord], settings: LabelSettings
) -> dict[str, str]:
    strategy = settings.mig_strategy
    if strategy == "none":
        return {}
    labels: dict[str, str] = {"nvidia.com/mig.strategy": strategy}
    enabled = [g.record for g in gpus if g.record.mig_enabled]
    by_profile: dict[str, list[GpuRecord]] = {}
    for mig in migs:
        assert mig.mig is not None
        by_profile.setdefault(mig.mig.profile, []).append(mig)
    if strategy == "single":
        if not enabled:
            return labels
        with_migs = {m.mig.parent_uuid for m in migs if m.mig is not None}
        reason = None
        if any(g.uuid not in with_migs for g in enabled):
            reason = "at least one MIG device is enabled but empty"
        elif len(enabled) != len(gpus):
            reason = "devices with MIG enabled and disabled detected"
        elif len(by_profile) != 1:
            reason = "more than one MIG device type present on node"
        if reason is not None:
            log.warning("mig_strategy_single_invalid", reason=reason)
            invalid = _Resource(GPU_RESOURCE, None)
            return labels | invalid.keys(
                product=invalid.product(enabled[0].name, "MIG", "INVALID"), count=0, replicas=0, memory=0
            )
    for profile, devices in by_profile.items():
        name = GPU_RESOURCE if strategy == "single" else mig_resource_name(profile)
        resource = _Resource(name, settings.sharing)
        labels |= resource.base(len(devices), devices[0].name, "MIG", profile.replace("+", "."))
        labels |= _mig_attributes(nvml, resource, devices[0])
    return labels


def _mig_attributes(nvml: Nvml, resource: _Resource, mig: GpuRecord) -> dict[str, str]:
    values: dict[str, object] = {"memory": mig.memory_mib}
    try:
        attrs = nvml.call("nvmlDeviceGetAttributes", nvml.call("nvmlDeviceGetHandleByUUID", mig.uuid))
    except NvmlError as exc:
        log.warning("mig_attributes_unreadable", uuid=mig.uuid, error=str(exc))
        return resource.keys(**values)
    values["memory"] = int(attrs.memorySizeMB)
    values |= {label: int(getattr(attrs, attr)) for label, attr in _MIG_ATTRIBUTES.items()}
    return resource.keys(**values)


def _version_labels(nvml: Nvml) -> dict[str, str]:
    labels: dict[str, str] = {}
    driver = _text(nvml.call("nvmlSystemGetDriverVersion"))
    parts = driver.split(".")
    if 2 <= len(parts) <= 3:
        major, minor, rev = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
        labels |= {
            "nvidia.com/cuda.driver.major": major,
            "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": rev,
            "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor,
            "nvidia.com/cuda.driver-version.revision": rev,
            "nvidia.com/cuda.driver-version.full": driver,
        }
    else:
        log.warning("driver_version_unparsed", version=driver, expected="X.Y[.Z]")
    cuda = int(nvml.call("nvmlSystemGetCudaDriverVersion"))
    cuda_major, cuda_minor = cuda // 1000, (cuda % 1000) // 10
    return labels | {
        "nvidia.com/cuda.runtime.major": str(cuda_major),
        "nvidia.com/cuda.runtime.minor": str(cuda_minor),
        "nvidia.com/cuda.runtime-version.major": str(cuda_major),
        "nvidia.com/cuda.runtime-version.minor": str(cuda_minor),
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


def machine_labels(settings: LabelSettings, now: float | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    if not settings.no_timestamp:
        labels["nvidia.com/gfd.timestamp"] = str(int(time.time() if now is None else now))
    machine = "unknown"
    if settings.machine_type_file:
        try:
            machine = Path(settings.machine_type_file).read_text().strip()
        except OSError as exc:
            log.warning("machine_type_unreadable", path=settings.machine_type_file, error=str(exc))
    labels["nvidia.com/gpu.machine"] = machine.replace(" ", "-")
    return labels


def _gpus(nvml: Nvml, records: Sequence[GpuRecord], sysfs: Path) -> list[_Gpu]:
    gpus = []
    for record in records:
        if record.kind != "gpu":
            continue
        try:
            handle = nvml.call("nvmlDeviceGetHandleByUUID", record.uuid)
            nvml.call("nvmlDeviceGetMigMode", handle)
            capable = True
        except NvmlError as exc:
            if exc.code == _nvml.GPU_IS_LOST:
                # Fell off the bus since discovery: not labelled, as discovery leaves lost GPUs out.
                log.warning("gpu_lost_skipped", gpu=record.index, uuid=record.uuid)
                continue
            if exc.code not in _NOT_MIG_CAPABLE:
                raise
            capable = False
        try:
            pci_class = (sysfs / "bus" / "pci" / "devices" / record.bus_id / "class").read_text().strip()
        except OSError as exc:
            log.warning("pci_class_unreadable", gpu=record.index, bus_id=record.bus_id, error=str(exc))
            pci_class = None
        gpus.append(_Gpu(record, capable, pci_class))
    return gpus


def node_labels(
    nvml: Nvml,
    settings: LabelSettings,
    *,
    sysfs: str | os.PathLike[str] = "/sys",
    proc: str | os.PathLike[str] = "/proc",
    now: float | None = None,
) -> dict[str, str]:
    """Every label for this node, read from NVML (open) and the files under ``sysfs`` / ``proc``.

    Raises:
        NvmlError: an NVML call failed (a lost GPU is left out instead).
    """
    labels = machine_labels(settings, now)
    records = discover_devices(nvml, sysfs=sysfs, proc=proc)
    gpus = _gpus(nvml, records, Path(sysfs))
    if not gpus:
        log.warning("no_gpus", note="only the machine labels are written")
        return labels
    labels |= _version_labels(nvml)
    labels["nvidia.com/mig.capable"] = str(any(g.mig_capable for g in gpus)).lower()
    labels["nvidia.com/mps.capable"] = str(_mps_capable(gpus, settings.sharing)).lower()
    labels |= _full_gpu_labels(gpus, settings.sharing)
    labels |= _mig_labels(nvml, gpus, [r for r in records if r.kind == "mig"], settings)
    modes = [g.pci_class for g in gpus]
    if len(set(modes)) > 1:
        log.warning("gpu_modes_differ", classes=modes, using=modes[0])
    labels["nvidia.com/gpu.mode"] = _PCI_MODES.get(modes[0] or "", "unknown")
    return labels


def _mps_capable(gpus: Sequence[_Gpu], sharing: Sharing) -> bool:
    if sharing.strategy != "mps":
        return False
    if any(g.record.mig_enabled for g in gpus):
        log.warning("mps_not_capable", reason="MPS sharing is not supported for MIG devices")
        return False
    return True


def read_node_labels(
    settings: LabelSettings,
    *,
    module: Any = None,
    sysfs: str | os.PathLike[str] | None = None,
    proc: str | os.PathLike[str] | None = None,
    now: float | None = None,
) -> dict[str, str]:
    """Open NVML as ``settings`` say (the fake model, or the driver under the driver root), label, close.

    ``module`` replaces ``pynvml`` (a fake); ``sysfs`` and ``proc`` default to ``/sys`` and ``/proc``,
    or to those under the driver root with a fake model.

    Raises:
        NvmlError: NVML could not start or a call failed.
    """
    from devplug_nvidia.discovery import nvml_source

    source = nvml_source(settings, module=module, sysfs=sysfs, proc=proc)
    with source.open() as nvml:
        return node_labels(nvml, settings, sysfs=source.sysfs, proc=source.proc, now=now)


def format_labels(labels: Mapping[str, str]) -> str:
    """``key=value`` lines, sorted by key (the NFD features-file format)."""
    return "".join(f"{key}={labels[key]}\n" for key in sorted(labels))


def write_labels(labels: Mapping[str, str], path: str | os.PathLike[str]) -> Path:
    """Write ``labels`` to ``path`` atomically: NFD sees the old file or the new one, never a part.

    Raises:
        OSError: the directory cannot be written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(format_labels(labels))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # NFD's worker may run as another user
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
