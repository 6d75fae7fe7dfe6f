"""The objects the fake returns, with the attribute names of pynvml's ctypes structures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PciInfo:
    busId: str
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int = 0x20B010DE
    pciSubSystemId: int = 0


@dataclass
class AddressingMode:
    value: int
    version: int = 1


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class DeviceAttributes:
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


@dataclass
class Placement:
    start: int
    size: int


@dataclass
class GpuInstanceProfileInfo:
    id: int
    isP2pSupported: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    copyEngineCount: int
    decoderCount: int
    encoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int


@dataclass
class ComputeInstanceProfileInfo:
    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int


@dataclass
class GpuInstanceInfo:
    device: Any
    id: int
    profileId: int
    placement: Placement


@dataclass
class ComputeInstanceInfo:
    device: Any
    gpuInstance: Any
    id: int
    profileId: int
    placement: Placement


@dataclass
class EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int
