"""The MIG part of the fake NVML: modes, MIG-device handles, GPU and compute instances.

Instances are created and destroyed as NVML does (dynamic MIG): a GPU instance at one of its
profile's possible placements (memory slices ``start`` to ``start + size``), refused with
INSUFFICIENT_RESOURCES where another instance holds one of those slices or the profile's
instance count is reached, NOT_SUPPORTED without MIG mode; one compute instance per profile fits
in a GPU instance as its slices allow; a GPU instance with compute instances is IN_USE; a
created compute instance appears as a MIG device (with a UUID) until it is destroyed.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._base import FakeBase, api
from devplug_nvidia.testing._handles import STARTS, ComputeInstance, Device, GpuInstance, MigDevice
from devplug_nvidia.testing._profiles import CI_PROFILE_BY_SLICES
from devplug_nvidia.testing._root import remove_instance_capabilities, write_instance_capabilities
from devplug_nvidia.testing._structs import (
    ComputeInstanceInfo,
    ComputeInstanceProfileInfo,
    DeviceAttributes,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
    Placement,
)

if TYPE_CHECKING:
    from devplug_nvidia.testing._specs import GiProfile


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    """pynvml's placement struct: where a GPU instance starts and how many memory slices it spans."""

    _fields_ = (("start", ctypes.c_uint), ("size", ctypes.c_uint))


#: Most MIG devices one GPU can hold (7 compute slices).
MAX_MIG_DEVICES = 7


class MigApi(FakeBase):
    """MIG functions of :class:`FakeNvml`."""

    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t

    def _mig_gpu(self, handle: object) -> Device:
        if isinstance(handle, MigDevice):
            raise C.NVMLError_InvalidArgument()
        device = self._gpu(handle)
        if not device.spec.mig_capable:
            raise C.NVMLError_NotSupported()
        return device

    @staticmethod
    def _mig(handle: object) -> MigDevice:
        if not isinstance(handle, MigDevice):
            raise C.NVMLError_InvalidArgument()
        return handle

    @api
    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        mode = (
            C.NVML_DEVICE_MIG_ENABLE if self._mig_gpu(device).spec.mig_enabled else C.NVML_DEVICE_MIG_DISABLE
        )
        return [mode, mode]

    @api
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object) -> int:
        self._mig_gpu(device)
        return MAX_MIG_DEVICES

    @api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int) -> MigDevice:
        gpu = self._mig_gpu(device)
        if not 0 <= index < MAX_MIG_DEVICES:
            raise C.NVMLError_InvalidArgument()
        if index >= len(gpu.mig_devices):
            raise C.NVMLError_NotFound()
        return gpu.mig_devices[index]

    @api
    def nvmlDeviceIsMigDeviceHandle(self, device: object) -> bool:
        return isinstance(self._any(device), MigDevice)

    @api
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: object) -> Device:
        return self._gpu(self._mig(migDevice).parent)

    @api
    def nvmlDeviceGetGpuInstanceId(self, device: object) -> int:
        return self._mig(self._any(device)).gpu_instance.id

    @api
    def nvmlDeviceGetComputeInstanceId(self, device: object) -> int:
        return self._mig(self._any(device)).compute_instance.id

    @api
    def nvmlDeviceGetAttributes(self, device: object) -> DeviceAttributes:
        mig = self._any(device)
        if not isinstance(mig, MigDevice):
            raise C.NVMLError_NotSupported()
        profile, ci = mig.gpu_instance.profile, mig.compute_instance
        return DeviceAttributes(
            multiprocessorCount=profile.multiprocessors // profile.slices * ci.slices,
            sharedCopyEngineCount=profile.copy_engines,
            sharedDecoderCount=profile.decoders,
            sharedEncoderCount=profile.encoders,
            sharedJpegCount=profile.jpegs,
            sharedOfaCount=profile.ofas,
            gpuInstanceSliceCount=profile.slices,
            computeInstanceSliceCount=ci.slices,
            memorySizeMB=profile.memory_mb,
        )

    @api
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: object, profile: int, version: int = 2
    ) -> GpuInstanceProfileInfo:
        for row in self._mig_gpu(device).spec.gi_profiles:
            if row.id == profile:
                return GpuInstanceProfileInfo(
                    id=row.nvml_id,
                    isP2pSupported=0,
                    sliceCount=row.slices,
                    instanceCount=row.instance_count,
                    multiprocessorCount=row.multiprocessors,
                    copyEngineCount=row.copy_engines,
                    decoderCount=row.decoders,
                    encoderCount=row.encoders,
                    jpegCount=row.jpegs,
                    ofaCount=row.ofas,
                    memorySizeMB=row.memory_mb,
                )
        raise C.NVMLError_NotSupported()

    @api
    def nvmlDeviceGetGpuInstanceById(self, device: object, gpuInstanceId: int) -> GpuInstance:
        for gi in self._mig_gpu(device).instances:
            if gi.id == gpuInstanceId:
                return gi
        raise C.NVMLError_NotFound()

    @api
    def nvmlGpuInstanceGetInfo(self, gpuInstance: object) -> GpuInstanceInfo:
        gi = _gi(gpuInstance)
        size = gi.profile.placement_size or gi.profile.slices
        return GpuInstanceInfo(gi.device, gi.id, gi.profile.nvml_id, Placement(gi.start, size))

    @api
    def nvmlGpuInstanceGetComputeInstanceById(
        self,
        gpuInstance: object,
        computeInstanceId: int,
    ) -> ComputeInstance:
        for ci in _gi(gpuInstance).compute_instances:
            if ci.id == computeInstanceId:
                return ci
        raise C.NVMLError_NotFound()

    @api
    def nvmlComputeInstanceGetInfo(self, computeInstance: object) -> ComputeInstanceInfo:
        if not isinstance(computeInstance, ComputeInstance):
            raise C.NVMLError_InvalidArgument()
        ci = computeInstance
        gi = ci.gpu_instance
        return ComputeInstanceInfo(gi.device, gi, ci.id, ci.profile_id, Placement(ci.start, ci.slices))

    @api
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self,
        device: object,
        profile: int,
        engProfile: int,
        version: int = 2,
    ) -> ComputeInstanceProfileInfo:
        gi = _gi(device)
        slices = next((s for s, p in CI_PROFILE_BY_SLICES.items() if p == profile), None)
        if slices is None or slices > gi.profile.slices or engProfile != 0:
            raise C.NVMLError_NotSupported()
        per_slice = gi.profile.multiprocessors // gi.profile.slices
        return ComputeInstanceProfileInfo(
            id=profile,
            sliceCount=slices,
            instanceCount=gi.profile.slices // slices,
            multiprocessorCount=per_slice * slices,
            sharedCopyEngineCount=gi.profile.copy_engines,
            sharedDecoderCount=gi.profile.decoders,
            sharedEncoderCount=gi.profile.encoders,
            sharedJpegCount=gi.profile.jpegs,
            sharedOfaCount=gi.profile.ofas,
        )

    # -- dynamic MIG: creating and destroying instances ---------------------------------------

    def _profile(self, device: Device, profile_id: int) -> GiProfile:
        """The GPU-instance profile NVML reports as ``profile_id`` (a ``GpuInstanceProfileInfo.id``)."""
        for row in device.spec.gi_profiles:
            if row.nvml_id == profile_id:
                return row
        raise C.NVMLError_InvalidArgument()

    @api
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: object, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """pynvml's C-style call: ``countRef`` a ``ctypes.pointer`` to a ``c_uint`` set to the
        count; ``placementsRef`` None (count only) or a ctypes array of
        :class:`c_nvmlGpuInstancePlacement_t` filled (INSUFFICIENT_SIZE when too short)."""
        gpu = self._mig_gpu(device)
        if not gpu.spec.mig_enabled:
            raise C.NVMLError_NotSupported()
        placements = possible_placements(self._profile(gpu, profileId))
        if placementsRef is not None:
            if len(placementsRef) < len(placements):
                raise C.NVMLError_InsufficientSize()
            for slot, placement in zip(placementsRef, placements, strict=False):
                slot.start, slot.size = placement.start, placement.size
        countRef.contents.value = len(placements)
        return C.NVML_SUCCESS

    @api
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: object, profileId: int) -> int:
        gpu = self._mig_gpu(device)
        profile = self._profile(gpu, profileId)
        free = [p for p in possible_placements(profile) if _fits(gpu, p)]
        return min(len(free), profile.instance_count - _count(gpu, profile))

    @api
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: object, profileId: int, placement: Any
    ) -> GpuInstance:
        """``placement``: a ``ctypes.pointer`` to a :class:`c_nvmlGpuInstancePlacement_t`, as
        pynvml passes it on to the C function."""
        placement = placement.contents
        gpu = self._mig_gpu(device)
        if not gpu.spec.mig_enabled:
            raise C.NVMLError_NotSupported()
        profile = self._profile(gpu, profileId)
        wanted = (placement.start, placement.size)
        if wanted not in [(p.start, p.size) for p in possible_placements(profile)]:
            raise C.NVMLError_InvalidArgument()
        with self._lock:
            if not _fits(gpu, Placement(placement.start, placement.size)) or (
                _count(gpu, profile) >= profile.instance_count
            ):
                raise C.NVMLError_InsufficientResources()
            used = {gi.id for gi in gpu.instances}
            gi = GpuInstance(gpu, min(set(range(1, 15)) - used), profile, placement.start)
            gpu.instances.append(gi)
        return gi

    @api
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: object, profileId: int) -> ComputeInstance:
        gi = _gi(gpuInstance)
        self._gpu(gi.device)
        if gi not in gi.device.instances:
            raise C.NVMLError_InvalidArgument()
        slices = next((s for s, p in CI_PROFILE_BY_SLICES.items() if p == profileId), None)
        if slices is None or slices > gi.profile.slices:
            raise C.NVMLError_NotSupported()
        with self._lock:
            taken = sum(ci.slices for ci in gi.compute_instances)
            if taken + slices > gi.profile.slices:
                raise C.NVMLError_InsufficientResources()
            used = {ci.id for ci in gi.compute_instances}
            ci = ComputeInstance(gi, min(set(range(8)) - used), slices, taken)
            gi.compute_instances.append(ci)
            device = gi.device
            uuid = self.model.mig_uuid(device.index, gi.id, ci.id)
            device.mig_devices.append(MigDevice(device, len(device.mig_devices), ci, uuid))
        if self.proc_root is not None:
            write_instance_capabilities(self.proc_root, device.index, gi.id, ci.id)
        return ci

    @api
    def nvmlComputeInstanceDestroy(self, computeInstance: object) -> None:
        if not isinstance(computeInstance, ComputeInstance):
            raise C.NVMLError_InvalidArgument()
        ci = computeInstance
        gi = ci.gpu_instance
        with self._lock:
            if ci not in gi.compute_instances:
                raise C.NVMLError_InvalidArgument()
            gi.compute_instances.remove(ci)
            device = gi.device
            device.mig_devices = [m for m in device.mig_devices if m.compute_instance is not ci]
            for slot, mig in enumerate(device.mig_devices):
                mig.slot = slot
        if self.proc_root is not None:
            remove_instance_capabilities(self.proc_root, device.index, gi.id, ci.id)

    @api
    def nvmlGpuInstanceDestroy(self, gpuInstance: object) -> None:
        gi = _gi(gpuInstance)
        with self._lock:
            if gi not in gi.device.instances:
                raise C.NVMLError_InvalidArgument()
            if gi.compute_instances:
                raise C.NVMLError_InUse()
            gi.device.instances.remove(gi)
        if self.proc_root is not None:
            remove_instance_capabilities(self.proc_root, gi.device.index, gi.id, None)


def possible_placements(profile: GiProfile) -> list[Placement]:
    """Where an instance of ``profile`` may start, and the memory slices it spans."""
    size = profile.placement_size or profile.slices
    return [Placement(start, size) for start in STARTS[profile.slices] if start + size <= 8]


def _fits(gpu: Device, placement: Placement) -> bool:
    """Whether no GPU instance holds a memory slice of ``placement``."""
    wanted = set(range(placement.start, placement.start + placement.size))
    for gi in gpu.instances:
        size = gi.profile.placement_size or gi.profile.slices
        if wanted & set(range(gi.start, gi.start + size)):
            return False
    return True


def _count(gpu: Device, profile: GiProfile) -> int:
    return sum(1 for gi in gpu.instances if gi.profile is profile)


def _gi(handle: object) -> GpuInstance:
    if not isinstance(handle, GpuInstance):
        raise C.NVMLError_InvalidArgument()
    return handle
