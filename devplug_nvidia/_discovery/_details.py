"""The details discovery reads for DRA: what NVIDIA's DRA driver publishes beyond the device
plugin's needs (brand, architecture, versions, addressing mode, PCIe root, module ID, MIG
placement and profile numbers).

Read only by :func:`devplug_nvidia.discovery.discover_devices` with ``details=True``, so the
device-plugin path makes no extra NVML call. Names are spelled as NVIDIA's go-nvlib spells them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from devplug.topology import pcie_root
from devplug_nvidia._gpu import _nvml
from devplug_nvidia._gpu._model import GpuDetails, GpuInstanceDetails
from devplug_nvidia._gpu._nvml import NvmlError

if TYPE_CHECKING:
    import os

    from devplug_nvidia._gpu._nvml import Nvml

__all__ = [
    "ADDRESSING_MODES",
    "ARCHITECTURES",
    "BRANDS",
    "SystemVersions",
    "gpu_details",
    "gpu_instance_details",
    "profile_table",
    "system_versions",
]

log = structlog.get_logger("devplug_nvidia.discovery")

BRANDS: dict[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
"""``NVML_BRAND_*`` → the name NVIDIA's DRA driver publishes."""
ARCHITECTURES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    0xFFFFFFFF: "Unknown",
}
"""``NVML_DEVICE_ARCH_*`` → the name NVIDIA's DRA driver publishes."""
ADDRESSING_MODES: dict[int, str] = {0: "None", 1: "HMM", 2: "ATS"}
"""``NVML_DEVICE_ADDRESSING_MODE_*`` → the published name."""
_ABSENT = (_nvml.NOT_SUPPORTED, _nvml.FUNCTION_NOT_FOUND)
_NO_PROFILE = (_nvml.NOT_SUPPORTED, _nvml.INVALID_ARGUMENT)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class SystemVersions:
    """The node's driver and CUDA driver versions (the same for every GPU)."""

    driver_version: str
    cuda_driver_version: int


def system_versions(nvml: Nvml) -> SystemVersions:
    """NVML's driver version text and CUDA driver version number.

    Raises:
        NvmlError: NVML cannot tell.
    """
    return SystemVersions(
        driver_version=_text(nvml.call("nvmlSystemGetDriverVersion")),
        cuda_driver_version=int(nvml.call("nvmlSystemGetCudaDriverVersion")),
    )


def _named(table: dict[int, str], value: int, event: str, gpu: int) -> str:
    name = table.get(value)
    if name is None:
        # NVIDIA's driver refuses to start on a value its library does not know; one GPU of a
        # newer kind should not take the node's other GPUs down.
        log.info(event, gpu=gpu, value=value, published="Unknown")
        return "Unknown"
    return name


def _addressing_mode(nvml: Nvml, handle: Any, gpu: int) -> str | None:
    try:
        mode = nvml.call("nvmlDeviceGetAddressingMode", handle)
    except NvmlError as exc:
        if exc.code in _ABSENT:
            return None
        raise
    value = int(getattr(mode, "value", mode))
    name = ADDRESSING_MODES.get(value)
    if name is None:
        log.info("unknown_addressing_mode", gpu=gpu, value=value, published="nothing")
    return name


def gpu_details(
    nvml: Nvml,
    handle: Any,
    *,
    index: int,
    bus_id: str,
    memory_bytes: int,
    system: SystemVersions,
    sysfs: str | os.PathLike[str],
) -> GpuDetails:
    """The DRA details of the full GPU ``handle`` (NVML index ``index``, sysfs bus ID ``bus_id``).

    Raises:
        NvmlError: NVML cannot tell the brand or the architecture, or the addressing mode
            fails otherwise than as unsupported.
    """
    return GpuDetails(
        memory_bytes=memory_bytes,
        brand=_named(BRANDS, int(nvml.call("nvmlDeviceGetBrand", handle)), "unknown_brand", index),
        architecture=_named(
            ARCHITECTURES, int(nvml.call("nvmlDeviceGetArchitecture", handle)), "unknown_architecture", index
        ),
        driver_version=system.driver_version,
        cuda_driver_version=system.cuda_driver_version,
        addressing_mode=_addressing_mode(nvml, handle, index),
        pcie_root=pcie_root(bus_id, sysfs=sysfs),
        module_id=_module_id(nvml, handle, index),
    )


def _module_id(nvml: Nvml, handle: Any, gpu: int) -> int | None:
    """``nvmlDeviceGetModuleId`` (NVIDIA's ``GetModuleId``); None where NVML does not tell.

    Only ``FabricManagerPartitioning`` publishes it, and NVIDIA's driver goes on without it when
    NVML fails, so a failure is logged rather than raised.
    """
    try:
        return int(nvml.call("nvmlDeviceGetModuleId", handle))
    except NvmlError as exc:
        if exc.code not in _ABSENT:
            log.info("module_id_unreadable", gpu=gpu, error=str(exc))
        return None


def profile_table(nvml: Nvml, parent: Any) -> dict[int, Any]:
    """``NVML_GPU_INSTANCE_PROFILE_*`` index → profile info, for the profiles the GPU has.

    Raises:
        NvmlError: a profile lookup failed otherwise than as unsupported.
    """
    table: dict[int, Any] = {}
    for index in range(nvml.const("NVML_GPU_INSTANCE_PROFILE_COUNT")):
        try:
            table[index] = nvml.call("nvmlDeviceGetGpuInstanceProfileInfo", parent, index)
        except NvmlError as exc:
            if exc.code not in _NO_PROFILE:
                raise
    return table


def gpu_instance_details(
    nvml: Nvml, parent: Any, gpu_instance: int, profiles: dict[int, Any], attributes: Any
) -> GpuInstanceDetails:
    """Profile and placement of GPU instance ``gpu_instance`` of ``parent``.

    NVML reports the instance's profile by its ID (19 for 1g.5gb on A100), which ``profiles``
    (:func:`profile_table`) maps back to its index, as NVIDIA's libraries do. ``attributes``:
    the MIG device's ``nvmlDeviceGetAttributes`` (a compute instance smaller than its GPU
    instance has fewer multiprocessors than the profile).

    Raises:
        NvmlError: the instance cannot be read, or its profile is not one of the GPU's.
    """
    handle = nvml.call("nvmlDeviceGetGpuInstanceById", parent, gpu_instance)
    info = nvml.call("nvmlGpuInstanceGetInfo", handle)
    profile_id = int(info.profileId)
    found = [(i, p) for i, p in sorted(profiles.items()) if int(p.id) == profile_id]
    if not found:
        raise NvmlError(
            f"GPU instance {gpu_instance} has profile ID {profile_id}, which is none of the GPU's "
            "MIG profiles",
            code=_nvml.NOT_FOUND,
            call="nvmlDeviceGetGpuInstanceProfileInfo",
        )
    index, profile = found[0]
    smaller = int(attributes.computeInstanceSliceCount) != int(attributes.gpuInstanceSliceCount)
    return GpuInstanceDetails(
        profile_index=index,
        profile_id=profile_id,
        placement_start=int(info.placement.start),
        placement_size=int(info.placement.size),
        multiprocessors=int(attributes.multiprocessorCount if smaller else profile.multiprocessorCount),
        copy_engines=int(profile.copyEngineCount),
        decoders=int(profile.decoderCount),
        encoders=int(profile.encoderCount),
        jpeg_engines=int(profile.jpegCount),
        ofa_engines=int(profile.ofaCount),
        memory_mb=int(profile.memorySizeMB),
    )
