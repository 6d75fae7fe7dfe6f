"""The MIG part of the fake NVML: modes, MIG-device handles, GPU and compute instances."""

from __future__ import annotations

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._base import FakeBase, api
from devplug_nvidia.testing._handles import ComputeInstance, Device, GpuInstance, MigDevice
from devplug_nvidia.testing._profiles import CI_PROFILE_BY_SLICES
from devplug_nvidia.testing._structs import (
    ComputeInstanceInfo,
    ComputeInstanceProfileInfo,
    DeviceAttributes,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
    Placement,
)

#: Most MIG devices one GPU can hold (7 compute slices).
MAX_MIG_DEVICES = 7


class MigApi(FakeBase):
    """MIG functions of :class:`FakeNvml`."""

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


def _gi(handle: object) -> GpuInstance:
    if not isinstance(handle, GpuInstance):
        raise C.NVMLError_InvalidArgument()
    return handle
