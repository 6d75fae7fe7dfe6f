"""What discovery finds: one record per advertisable NVIDIA device (a full GPU or a MIG device).

Pure data, shared by discovery (NVML → records), the Allocate builder (records → responses),
CDI spec generation, health and feature labels. No NVML calls here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["GpuDetails", "GpuInstanceDetails", "GpuRecord", "MigInfo"]


@dataclass(frozen=True)
class GpuDetails:
    """What DRA publishes of a full GPU beyond the device plugin's needs (discovery with
    ``details=True``); a MIG device carries its parent's."""

    memory_bytes: int
    """Total memory as NVML reports it, in bytes."""
    brand: str
    """NVML's brand as NVIDIA's tools name it: ``Nvidia``, ``Tesla``, ``GeForce``, ..."""
    architecture: str
    """``Ampere``, ``Hopper``, ``Ada Lovelace``, ..."""
    driver_version: str
    """NVML's driver version text, e.g. ``550.54.15``."""
    cuda_driver_version: int
    """NVML's CUDA driver version number, e.g. 12040."""
    addressing_mode: str | None = None
    """``ATS``, ``HMM`` or ``None``; None when NVML cannot tell."""
    pcie_root: str | None = None
    """The PCIe root complex from sysfs (``pci0000:3a``), when it resolves."""
    module_id: int | None = None
    """``nvmlDeviceGetModuleId``: the GPU's module (its slot on an HGX board, the ID Fabric
    Manager knows it by); None when NVML cannot tell."""


@dataclass(frozen=True)
class GpuInstanceDetails:
    """The GPU instance of a MIG device, as DRA publishes it (discovery with ``details=True``)."""

    profile_index: int
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` index of its profile."""
    profile_id: int
    """The profile's ID as NVML reports it (``nvidia-smi mig -lgip``; 19 for 1g.5gb on A100)."""
    placement_start: int
    placement_size: int
    """Its placement on the GPU's memory slices."""
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mb: int
    """The profile's numbers (``multiprocessors``: the compute instance's own)."""


@dataclass(frozen=True)
class MigInfo:
    """The MIG side of a MIG device."""

    parent_uuid: str
    """UUID of the GPU the MIG device lives on (``GPU-...``)."""
    parent_index: int
    """NVML index of the parent GPU."""
    parent_minor: int
    """Minor number of the parent GPU: ``/dev/nvidia<minor>``."""
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    """The profile name as upstream computes it, e.g. ``1g.5gb``, ``1g.10gb+me``, ``1c.3g.20gb``."""
    cap_paths: tuple[str, ...] = ()
    """The GI and CI access capability nodes, e.g. ``/dev/nvidia-caps/nvidia-cap21``."""
    gpu_instance: GpuInstanceDetails | None = None
    """Profile and placement of its GPU instance; read only by discovery with ``details=True``."""


@dataclass(frozen=True)
class GpuRecord:
    """One device as the plugin advertises it (before time-slicing / MPS replication)."""

    kind: Literal["gpu", "mig"]
    index: str
    """NVML index: ``"3"`` for a GPU, ``"<gpu>:<slot>"`` for a MIG device."""
    uuid: str
    """``GPU-...`` or ``MIG-...``."""
    minor: int
    """Minor number of the device node (the parent's for a MIG device)."""
    name: str
    """Product name from NVML, e.g. ``NVIDIA A100-SXM4-40GB``."""
    memory_mib: int
    """Memory in MiB (the MIG device's own for MIG)."""
    bus_id: str
    """PCI bus ID in sysfs form (``0000:3b:00.0``); the parent's for MIG."""
    numa_node: int | None
    """Host NUMA node from sysfs; None: no topology."""
    compute_capability: tuple[int, int]
    """(major, minor) of the GPU (the parent's for MIG)."""
    mig: MigInfo | None = None
    mig_enabled: bool = False
    """For a full GPU: MIG mode is on (only meaningful with the none strategy)."""
    details: GpuDetails | None = None
    """What DRA publishes of the GPU (the parent's for MIG); read only by discovery with
    ``details=True``."""
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def device_paths(self) -> tuple[str, ...]:
        """The container-side device nodes of this device (without the control nodes)."""
        paths = (f"/dev/nvidia{self.minor}",)
        return paths + (self.mig.cap_paths if self.mig is not None else ())

    def device_id(self, strategy: Literal["uuid", "index"]) -> str:
        """The ID the plugin lists for this device under the device-ID strategy."""
        return self.uuid if strategy == "uuid" else self.index
