"""The fake's opaque handles: GPUs, MIG devices, GPU instances and compute instances."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devplug_nvidia.testing._profiles import CI_PROFILE_BY_SLICES

if TYPE_CHECKING:
    from devplug_nvidia.testing._specs import GiProfile, GpuSpec, MachineModel

# Allowed start slices per GPU-instance size, and the GI ID NVML gives each placement on A100.
STARTS = {1: range(7), 2: (0, 2, 4), 3: (0, 4), 4: (0,), 7: (0,)}
_GI_IDS = {(7, 0): 0, (4, 0): 1, (3, 0): 1, (3, 4): 2, (2, 0): 3, (2, 2): 4, (2, 4): 5}


@dataclass(eq=False)
class Device:
    """A full-GPU handle."""

    index: int
    spec: GpuSpec
    uuid: str
    instances: list[GpuInstance] = field(default_factory=list)
    mig_devices: list[MigDevice] = field(default_factory=list)
    lost: bool = False
    compute_mode: int = 0
    """NVML's compute mode (0: DEFAULT, 3: EXCLUSIVE_PROCESS), as nvmlDeviceSetComputeMode left it."""

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index} {self.uuid}>"


@dataclass(eq=False)
class GpuInstance:
    device: Device
    id: int
    profile: GiProfile
    start: int
    compute_instances: list[ComputeInstance] = field(default_factory=list)


@dataclass(eq=False)
class ComputeInstance:
    gpu_instance: GpuInstance
    id: int
    slices: int
    start: int

    @property
    def profile_id(self) -> int:
        return CI_PROFILE_BY_SLICES[self.slices]


@dataclass(eq=False)
class MigDevice:
    """A MIG-device handle: one compute instance seen as a device."""

    parent: Device
    slot: int
    compute_instance: ComputeInstance
    uuid: str

    @property
    def gpu_instance(self) -> GpuInstance:
        return self.compute_instance.gpu_instance

    def __repr__(self) -> str:
        return f"<fake MIG nvmlDevice {self.parent.index}:{self.slot} {self.uuid}>"


def build_devices(model: MachineModel) -> list[Device]:
    """The GPU handles of ``model``, with their MIG trees built from the specs."""
    devices = []
    for index, spec in enumerate(model.gpus):
        device = Device(index, spec, model.gpu_uuid(index))
        if spec.mig_enabled:
            _build_mig(model, device)
        devices.append(device)
    return devices


def _build_mig(model: MachineModel, device: Device) -> None:
    profiles = {profile.id: profile for profile in device.spec.gi_profiles}
    used: set[int] = set()
    for instance in device.spec.mig_instances:
        profile = profiles[instance.gi_profile_id]
        start = next(s for s in STARTS[profile.slices] if used.isdisjoint(range(s, s + profile.slices)))
        used.update(range(start, start + profile.slices))
        gi_id = _GI_IDS.get((profile.slices, start), 7 + start if profile.slices == 1 else 100 + start)
        gi = GpuInstance(device, gi_id, profile, start)
        ci_start = 0
        for ci_id, slices in enumerate(instance.ci_slices or (profile.slices,)):
            gi.compute_instances.append(ComputeInstance(gi, ci_id, slices, ci_start))
            ci_start += slices
        device.instances.append(gi)
    for gi in device.instances:
        for ci in gi.compute_instances:
            uuid = model.mig_uuid(device.index, gi.id, ci.id)
            device.mig_devices.append(MigDevice(device, len(device.mig_devices), ci, uuid))
