"""NVML constants and the ``NVMLError`` hierarchy, with pynvml's names and values.

Only what the fake implements is defined here; a test checks that every name exists in the
installed ``pynvml`` with the same value, so drift is caught.
"""

from __future__ import annotations

from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0

NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX = 0xA
NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX = 0xB
NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX = 0xC
NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME = 0xD
NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME = 0xE
NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME = 0xF
NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME = 0x10
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0

NVML_BRAND_UNKNOWN = 0
NVML_BRAND_QUADRO = 1
NVML_BRAND_TESLA = 2
NVML_BRAND_NVS = 3
NVML_BRAND_GRID = 4
NVML_BRAND_GEFORCE = 5
NVML_BRAND_TITAN = 6
NVML_BRAND_NVIDIA_VAPPS = 7
NVML_BRAND_NVIDIA_VPC = 8
NVML_BRAND_NVIDIA_VCS = 9
NVML_BRAND_NVIDIA_VWS = 10
NVML_BRAND_NVIDIA_CLOUD_GAMING = 11
NVML_BRAND_QUADRO_RTX = 12
NVML_BRAND_NVIDIA_RTX = 13
NVML_BRAND_NVIDIA = 14
NVML_BRAND_GEFORCE_RTX = 15
NVML_BRAND_TITAN_RTX = 16

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_DEVICE_ADDRESSING_MODE_NONE = 0
NVML_DEVICE_ADDRESSING_MODE_HMM = 1
NVML_DEVICE_ADDRESSING_MODE_ATS = 2

_ERROR_NAMES = {
    value: name.removeprefix("NVML_ERROR_")
    for name, value in dict(globals()).items()
    if name.startswith("NVML_ERROR_")
}


# The messages NVML gives where the code's name does not spell them.
_MESSAGES = {
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Base of the fake's errors; ``NVMLError(code)`` builds the subclass for that code, as pynvml does."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    _code: ClassVar[int] = NVML_ERROR_UNKNOWN
    value: int

    def __new__(cls, *args: Any) -> NVMLError:
        value = args[0] if cls is NVMLError and args else cls._code
        target = NVMLError._valClassMapping.get(value, NVMLError) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, *args: Any) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        if self.value in _MESSAGES:
            return _MESSAGES[self.value]
        if self.value in _ERROR_NAMES:
            return _ERROR_NAMES[self.value].replace("_", " ").title()
        return f"NVML Error with code {self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _error_class(code: int) -> type[NVMLError]:
    name = "NVMLError_" + "".join(part.capitalize() for part in _ERROR_NAMES[code].split("_"))
    cls = type(name, (NVMLError,), {"_code": code, "__module__": __name__})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_Uninitialized = _error_class(NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class(NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class(NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class(NVML_ERROR_NO_PERMISSION)
NVMLError_AlreadyInitialized = _error_class(NVML_ERROR_ALREADY_INITIALIZED)
NVMLError_NotFound = _error_class(NVML_ERROR_NOT_FOUND)
NVMLError_InsufficientSize = _error_class(NVML_ERROR_INSUFFICIENT_SIZE)
NVMLError_InsufficientPower = _error_class(NVML_ERROR_INSUFFICIENT_POWER)
NVMLError_DriverNotLoaded = _error_class(NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class(NVML_ERROR_TIMEOUT)
NVMLError_IrqIssue = _error_class(NVML_ERROR_IRQ_ISSUE)
NVMLError_LibraryNotFound = _error_class(NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class(NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_CorruptedInforom = _error_class(NVML_ERROR_CORRUPTED_INFOROM)
NVMLError_GpuIsLost = _error_class(NVML_ERROR_GPU_IS_LOST)
NVMLError_ResetRequired = _error_class(NVML_ERROR_RESET_REQUIRED)
NVMLError_OperatingSystem = _error_class(NVML_ERROR_OPERATING_SYSTEM)
NVMLError_LibRmVersionMismatch = _error_class(NVML_ERROR_LIB_RM_VERSION_MISMATCH)
NVMLError_InUse = _error_class(NVML_ERROR_IN_USE)
NVMLError_Memory = _error_class(NVML_ERROR_MEMORY)
NVMLError_NoData = _error_class(NVML_ERROR_NO_DATA)
NVMLError_InsufficientResources = _error_class(NVML_ERROR_INSUFFICIENT_RESOURCES)
NVMLError_Unknown = _error_class(NVML_ERROR_UNKNOWN)

NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
