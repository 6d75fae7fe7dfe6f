"""Discovery records → the devices NVIDIA's DRA driver (``gpu.nvidia.com``, v0.5.0) publishes.

Pure. One device per full GPU without MIG mode (``gpu-<minor>``) and one per existing MIG device
(``gpu-<parent minor>-mig-<profile>-<GI profile ID>-<placement start>``); a MIG-enabled GPU is
announced only through its MIG devices. Attributes and capacities carry NVIDIA's names, types
and normalisation (nvidia-dra.md §2-3): versions coerced to semantic versions as NVIDIA's
driver does (``9.0`` → ``9.0.0``, ``580.95.05`` → ``580.95.5``, CUDA 13000 → ``13.0.0``), the
memory in bytes written as Kubernetes writes a binary quantity (``80Gi``, ``9728Mi``). With
``FabricManagerPartitioning`` a full GPU also carries ``gpuModuleID`` (an int, where NVML
reports a module other than 0; never on MIG devices). ``resource.kubernetes.io/numaNode`` is
devplug's, from the devices' NUMA node.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from devplug.models import Device, Version
from devplug.topology import PCI_BUS_ID_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from devplug.models import AttributeValue
    from devplug_nvidia._gpu._model import GpuDetails, GpuRecord

__all__ = [
    "DRIVER_NAME",
    "MODULE_ID_ATTRIBUTE",
    "announced",
    "binary_quantity",
    "device_of",
    "dra_devices",
    "gpu_device_name",
    "mig_device_name",
    "semantic_version",
]

DRIVER_NAME = "gpu.nvidia.com"
"""NVIDIA's DRA driver name (the default ``--driver-name``)."""
_LOOSE_VERSION = re.compile(
    r"v?(?P<major>[0-9]+)(?:\.(?P<minor>[0-9]+))?(?:\.(?P<patch>[0-9]+))?"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+(?P<meta>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
_NOT_LABEL = re.compile(r"[^a-z0-9-.]")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def semantic_version(text: str) -> str:
    """``text`` as a semantic version, coerced as NVIDIA's driver coerces it (Masterminds
    semver): missing parts are 0 and leading zeros go, ``9.0`` → ``9.0.0``,
    ``580.95.05`` → ``580.95.5``.

    Raises:
        ValueError: ``text`` is no version at all.
    """
    match = _LOOSE_VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a version")
    version = f"{int(match['major'])}.{int(match['minor'] or 0)}.{int(match['patch'] or 0)}"
    if match["pre"]:
        version += f"-{match['pre']}"
    if match["meta"]:
        version += f"+{match['meta']}"
    return version


def cuda_version(number: int) -> str:
    """NVML's CUDA driver version number as a version: 12040 → ``12.4.0``, 13000 → ``13.0.0``."""
    return semantic_version(f"{number // 1000}.{number % 1000 // 10}")


def binary_quantity(value: int) -> str:
    """An integer as Kubernetes writes a binary-SI quantity: the largest power-of-1024 suffix that
    divides it (``85899345920`` → ``80Gi``, ``10200547328`` → ``9728Mi``), no suffix below 1024."""
    if -1024 < value < 1024:
        return str(value)
    exponent = 0
    while value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        exponent += 1
    return f"{value}{_BINARY_SUFFIXES[exponent]}"


def gpu_device_name(minor: int) -> str:
    """``gpu-<minor>``: a full GPU by the minor of its ``/dev/nvidia<minor>``."""
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, profile_id: int, placement_start: int) -> str:
    """``gpu-<parent minor>-mig-<profile>-<GI profile ID>-<placement start>``; the profile with
    its dots removed, lower case, other characters outside ``[a-z0-9-.]`` turned into ``-``
    (``1g.10gb+me`` → ``1g10gb-me``)."""
    name = _NOT_LABEL.sub("-", profile.replace(".", "").lower()).strip("-").removesuffix(".")
    return f"gpu-{parent_minor}-mig-{name}-{profile_id}-{placement_start}"


def _common(record: GpuRecord, details: GpuDetails) -> dict[str, AttributeValue]:
    """The attributes a GPU and its MIG devices share (the GPU's)."""
    major, minor = record.compute_capability
    attributes: dict[str, AttributeValue] = {
        "productName": record.name,
        "brand": details.brand,
        "architecture": details.architecture,
        "cudaComputeCapability": Version(semantic_version(f"{major}.{minor}")),
        "driverVersion": Version(semantic_version(details.driver_version)),
        "cudaDriverVersion": Version(cuda_version(details.cuda_driver_version)),
        PCI_BUS_ID_ATTRIBUTE: record.bus_id,
    }
    if details.pcie_root is not None:
        attributes[PCIE_ROOT_ATTRIBUTE] = details.pcie_root
    if details.addressing_mode is not None:
        attributes["addressingMode"] = details.addressing_mode
    return attributes


def _details(record: GpuRecord) -> GpuDetails:
    if record.details is None:
        raise ValueError(f"{record.uuid}: discovery ran without details (details=True is needed for DRA)")
    return record.details


MODULE_ID_ATTRIBUTE = "gpuModuleID"
"""A full GPU's module ID, with ``FabricManagerPartitioning`` (NVIDIA v0.5.0)."""


def gpu_device(record: GpuRecord, *, fabric: bool = False) -> Device:
    """The published device of a full GPU (``fabric``: with ``gpuModuleID``)."""
    details = _details(record)
    attributes: dict[str, AttributeValue] = {"type": "gpu", "uuid": record.uuid, **_common(record, details)}
    if fabric and details.module_id:
        attributes[MODULE_ID_ATTRIBUTE] = details.module_id
    return Device(
        id=record.uuid,
        name=gpu_device_name(record.minor),
        numa_nodes=() if record.numa_node is None else (record.numa_node,),
        attributes=attributes,
        capacity={"memory": binary_quantity(details.memory_bytes)},
    )


def mig_device(record: GpuRecord) -> Device:
    """The published device of a MIG device (static MIG: one that exists)."""
    details, mig = _details(record), record.mig
    if mig is None or mig.gpu_instance is None:
        raise ValueError(f"{record.uuid}: not a MIG device discovered with details")
    gi = mig.gpu_instance
    capacity: dict[str, str] = {
        "multiprocessors": binary_quantity(gi.multiprocessors),
        "copyEngines": binary_quantity(gi.copy_engines),
        "decoders": binary_quantity(gi.decoders),
        "encoders": binary_quantity(gi.encoders),
        "jpegEngines": binary_quantity(gi.jpeg_engines),
        "ofaEngines": binary_quantity(gi.ofa_engines),
        "memory": binary_quantity(gi.memory_mb * 1024 * 1024),
    }
    capacity.update(
        (f"memorySlice{i}", "1") for i in range(gi.placement_start, gi.placement_start + gi.placement_size)
    )
    return Device(
        id=record.uuid,
        name=_name(record),
        numa_nodes=() if record.numa_node is None else (record.numa_node,),
        attributes={
            "type": "mig",
            "uuid": record.uuid,
            "parentUUID": mig.parent_uuid,
            "profile": mig.profile,
            **_common(record, details),
        },
        capacity=capacity,
    )


def announced(records: Iterable[GpuRecord]) -> list[GpuRecord]:
    """The records NVIDIA announces: full GPUs without MIG mode and every MIG device, by parent
    minor (a GPU before its MIG devices), then device name."""
    chosen = [r for r in records if r.kind == "mig" or not r.mig_enabled]
    return sorted(chosen, key=lambda r: (r.minor, r.kind != "gpu", _name(r)))


def _name(record: GpuRecord) -> str:
    mig = record.mig
    if mig is None or mig.gpu_instance is None:
        return gpu_device_name(record.minor)
    return mig_device_name(
        mig.parent_minor, mig.profile, mig.gpu_instance.profile_id, mig.gpu_instance.placement_start
    )


def device_of(record: GpuRecord, *, fabric: bool = False) -> Device:
    """The published device of ``record`` (discovered with ``details=True``; ``fabric``:
    ``FabricManagerPartitioning`` is on).

    Raises:
        ValueError: the record lacks the details, or a value breaks DRA's rules.
    """
    return gpu_device(record, fabric=fabric) if record.kind == "gpu" else mig_device(record)


def dra_devices(records: Sequence[GpuRecord]) -> list[Device]:
    """The devices published for ``records``, in :func:`announced` order.

    Raises:
        ValueError: a record lacks the details, or a value breaks DRA's rules.
    """
    return [device_of(r) for r in announced(records)]
