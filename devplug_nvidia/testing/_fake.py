"""FakeNvml: an object that answers like the ``pynvml`` module, driven by a machine model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._base import api
from devplug_nvidia.testing._events import EventsApi
from devplug_nvidia.testing._handles import Device, MigDevice
from devplug_nvidia.testing._mig import MigApi
from devplug_nvidia.testing._structs import AddressingMode, Memory, PciInfo

if TYPE_CHECKING:
    from devplug_nvidia.testing._specs import MachineModel, NvLink

_MIB = 1024 * 1024


class FakeNvml(MigApi, EventsApi):
    """A stand-in for the ``pynvml`` module: same function names, constants and error classes.

    Pass it wherever the real module would go (``devplug_nvidia`` takes the module as a
    parameter). Constants and ``NVMLError*`` classes are attributes, as on ``pynvml``. Besides the
    NVML functions it has test controls: :meth:`fail`, ``push_*`` for events, ``lose_gpu``.

    Args:
        model: the machine (see ``MODELS``).
        init_error: an NVML error code ``nvmlInit`` raises (e.g. ``NVML_ERROR_LIBRARY_NOT_FOUND``).
    """

    def __init__(self, model: MachineModel, *, init_error: int | None = None) -> None:
        super().__init__(model, init_error=init_error)

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes, looked up like attributes of the pynvml module.
        if name.startswith(("NVML", "nvmlEventType")) and hasattr(C, name):
            return getattr(C, name)
        raise AttributeError(name)

    def __dir__(self) -> list[str]:
        names = [n for n in vars(C) if n.startswith(("NVML", "nvmlEventType"))]
        return sorted({*super().__dir__(), *names})

    # -- library and system ----------------------------------------------------------------------

    @api
    def nvmlInit(self) -> None:
        if self._init_error is not None:
            raise C.NVMLError(self._init_error)
        self._init_count += 1

    @api
    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    @api
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.model.driver_version

    @api
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.model.cuda_driver_version

    # -- devices ---------------------------------------------------------------------------------

    @api
    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    @api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        if not 0 <= index < len(self.devices):
            raise C.NVMLError_InvalidArgument()
        return self._gpu(self.devices[index])

    @api
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Device | MigDevice:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for device in self.devices:
            if device.uuid == wanted:
                return self._gpu(device)
            for mig in device.mig_devices:
                if mig.uuid == wanted:
                    return mig
        raise C.NVMLError_NotFound()

    @api
    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._any(handle).uuid

    @api
    def nvmlDeviceGetName(self, handle: object) -> str:
        device = self._any(handle)
        if isinstance(device, MigDevice):
            return f"{device.parent.spec.name} MIG {_mig_label(device)}"
        return device.spec.name

    @api
    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return self._gpu(handle).index

    @api
    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        # MIG devices have no minor of their own: NVML answers NOT_SUPPORTED (as here).
        if isinstance(handle, MigDevice):
            raise C.NVMLError_NotSupported()
        return self._gpu(handle).index

    @api
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Memory:
        device = self._any(handle)
        if isinstance(device, MigDevice):
            total = device.gpu_instance.profile.memory_mb * _MIB
        else:
            total = device.spec.memory_mib * _MIB
        used = 512 * _MIB
        return Memory(total=total, free=total - used, used=used)

    @api
    def nvmlDeviceGetPciInfo(self, handle: object) -> PciInfo:
        return _pci_info(self._gpu(handle, allow_mig=True).spec.bus_id)

    @api
    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        return self._gpu(handle, allow_mig=True).spec.compute_capability

    @api
    def nvmlDeviceGetBrand(self, handle: object) -> int:
        spec = self._gpu(handle, allow_mig=True).spec
        if spec.brand is not None:
            return spec.brand
        return C.NVML_BRAND_TESLA if spec.name.startswith("Tesla") else C.NVML_BRAND_NVIDIA

    @api
    def nvmlDeviceGetArchitecture(self, handle: object) -> int:
        spec = self._gpu(handle, allow_mig=True).spec
        if spec.architecture is not None:
            return spec.architecture
        return _architecture(spec.compute_capability)

    @api
    def nvmlDeviceGetAddressingMode(self, handle: object) -> AddressingMode:
        spec = self._gpu(handle).spec
        if spec.addressing_mode is None:
            raise C.NVMLError_NotSupported()
        return AddressingMode(spec.addressing_mode)

    @api
    def nvmlDeviceGetModuleId(self, handle: object) -> int:
        spec = self._gpu(handle).spec
        if spec.module_id is None:
            raise C.NVMLError_NotSupported()
        return spec.module_id

    # -- topology and NVLink -----------------------------------------------------------------------

    @api
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: object, device2: object) -> int:
        return self.model.levels[self._gpu(device1).index][self._gpu(device2).index]

    @api
    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:
        spec = self._link(device, link)
        return C.NVML_FEATURE_ENABLED if spec.active else C.NVML_FEATURE_DISABLED

    @api
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: object, link: int) -> PciInfo:
        return _pci_info(self._link(device, link).remote_bus_id)

    @api
    @api
    def nvmlDeviceGetComputeMode(self, handle: object) -> int:
        return self._gpu(handle).compute_mode

    @api
    def nvmlDeviceSetComputeMode(self, handle: object, mode: int) -> None:
        """Records the mode on the GPU (MIG handles are refused, as NVML refuses them)."""
        if isinstance(handle, MigDevice):
            raise C.NVMLError_NotSupported()
        if mode not in range(C.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS + 1):
            raise C.NVMLError_InvalidArgument()
        self._gpu(handle).compute_mode = mode

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        return self._link(handle, link).remote_type

    def _link(self, handle: object, link: int) -> NvLink:
        links = self._gpu(handle).spec.nvlinks
        if links is None:
            raise C.NVMLError_NotSupported()
        if not 0 <= link < C.NVML_NVLINK_MAX_LINKS:
            raise C.NVMLError_InvalidArgument()
        if link >= len(links):
            raise C.NVMLError_NotSupported()
        return links[link]


def _pci_info(bus_id: str) -> PciInfo:
    domain, bus, rest = bus_id.split(":")
    return PciInfo(
        busId=bus_id,
        busIdLegacy=f"{int(domain, 16):04X}:{bus}:{rest}",
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(rest.split(".")[0], 16),
    )


def _architecture(compute_capability: tuple[int, int]) -> int:
    """What NVML reports for a GPU of this compute capability."""
    major, minor = compute_capability
    if major == 7:
        return C.NVML_DEVICE_ARCH_TURING if minor >= 5 else C.NVML_DEVICE_ARCH_VOLTA
    if major == 8:
        return C.NVML_DEVICE_ARCH_ADA if minor == 9 else C.NVML_DEVICE_ARCH_AMPERE
    by_major = {
        3: C.NVML_DEVICE_ARCH_KEPLER,
        5: C.NVML_DEVICE_ARCH_MAXWELL,
        6: C.NVML_DEVICE_ARCH_PASCAL,
        9: C.NVML_DEVICE_ARCH_HOPPER,
        10: C.NVML_DEVICE_ARCH_BLACKWELL,
        12: C.NVML_DEVICE_ARCH_BLACKWELL,
    }
    return by_major.get(major, C.NVML_DEVICE_ARCH_UNKNOWN)


def _mig_label(device: MigDevice) -> str:
    gi = device.gpu_instance
    memory_gb = round(gi.profile.memory_mb / 1024)
    return f"{gi.profile.slices}g.{memory_gb}gb"
