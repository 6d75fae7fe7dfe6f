"""The data a fake machine is made of: GPUs, NVLinks, MIG instances and topology levels.

Pure data (frozen dataclasses); the fake NVML reads it, the root writer turns it into files.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from devplug_nvidia.testing import _errors as C

_UUID_NAMESPACE = uuid.UUID("6f1d8a2e-4c1b-4b7e-9a53-2d0c7e1f5a90")


def stable_uuid(prefix: str, *parts: object) -> str:
    """A UUID that depends only on ``parts`` (so a model's UUIDs never change between runs)."""
    return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, '/'.join(map(str, parts)))}"


@dataclass(frozen=True)
class GiProfile:
    """One row of a GPU's MIG GPU-instance profile table (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    id: int
    slices: int
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    memory_mb: int
    profile_id: int | None = None
    """The ID NVML reports for the profile (``GpuInstanceProfileInfo.id``,
    ``GpuInstanceInfo.profileId``; on real GPUs e.g. 19 for 1g.5gb); default: ``id``, the
    ``NVML_GPU_INSTANCE_PROFILE_*`` index the profile is looked up by."""
    placement_size: int | None = None
    """Memory slices one instance of the profile spans (``GpuInstanceInfo.placement.size``;
    real A100s: 8 for 7g.40gb); default: ``slices``."""

    @property
    def nvml_id(self) -> int:
        return self.id if self.profile_id is None else self.profile_id


@dataclass(frozen=True)
class MigInstance:
    """One GPU instance and the compute instances inside it."""

    gi_profile_id: int
    """A ``NVML_GPU_INSTANCE_PROFILE_*`` value; must be in the GPU's profile table."""
    ci_slices: tuple[int, ...] = ()
    """Compute slices of each compute instance; empty: one CI spanning the whole GI."""


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU: where it goes and whether it is up."""

    remote_bus_id: str
    """NVML 8-digit bus ID of the other end (a GPU or an NVSwitch)."""
    remote_type: int = C.NVML_NVLINK_DEVICE_TYPE_GPU
    active: bool = True


@dataclass(frozen=True)
class GpuSpec:
    """One physical GPU of a fake machine."""

    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    bus_id: str
    """NVML 8-digit form, upper case: ``00000000:07:00.0``."""
    numa_node: int | None = None
    """What ``/sys/bus/pci/devices/<bus>/numa_node`` says; None writes ``-1``."""
    nvlinks: tuple[NvLink, ...] | None = ()
    """None: the GPU has no NVLink at all (NOT_SUPPORTED); empty: supported but none wired."""
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    gi_profiles: tuple[GiProfile, ...] = ()
    events_supported: bool = True
    """False: ``nvmlDeviceRegisterEvents`` raises NOT_SUPPORTED (old GPUs)."""
    supported_events: int = (
        C.nvmlEventTypeXidCriticalError | C.nvmlEventTypeDoubleBitEccError | C.nvmlEventTypeSingleBitEccError
    )
    pci_class: int = 0x030200
    """PCI class code in sysfs: ``0x030200`` (3D controller: compute mode), ``0x030000`` (VGA: graphics)."""
    brand: int | None = None
    """``nvmlDeviceGetBrand``: an ``NVML_BRAND_*`` value; None: Tesla for ``Tesla ...`` names,
    else NVIDIA (what data-center GPUs report)."""
    architecture: int | None = None
    """``nvmlDeviceGetArchitecture``: an ``NVML_DEVICE_ARCH_*`` value; None: from the compute
    capability."""
    addressing_mode: int | None = None
    """``nvmlDeviceGetAddressingMode``: an ``NVML_DEVICE_ADDRESSING_MODE_*`` value; None:
    NOT_SUPPORTED (drivers before 570, and most PCIe systems)."""
    module_id: int | None = None
    """``nvmlDeviceGetModuleId``: the GPU's module on an HGX board (1 to 8, the ID Fabric Manager
    knows it by); None: NOT_SUPPORTED."""


@dataclass(frozen=True)
class MachineModel:
    """A whole fake machine: GPUs in NVML index order plus the pairwise topology levels."""

    name: str
    gpus: tuple[GpuSpec, ...]
    levels: tuple[tuple[int, ...], ...]
    """``levels[i][j]``: ``nvmlDeviceGetTopologyCommonAncestor`` of GPUs i and j."""
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    description: str = ""
    switch_bus_ids: tuple[str, ...] = field(default=())
    """The NVSwitches' bus IDs: the root lists them in ``/proc/driver/nvidia-nvswitch/devices``,
    as the NVSwitch driver does on a host whose fabric Fabric Manager runs."""

    def gpu_uuid(self, index: int) -> str:
        """The stable ``GPU-...`` UUID of GPU ``index``."""
        return stable_uuid("GPU", self.name, index)

    def mig_uuid(self, index: int, gi: int, ci: int) -> str:
        """The stable ``MIG-...`` UUID of a MIG device."""
        return stable_uuid("MIG", self.name, index, gi, ci)
