"""The fake NVML creates and destroys MIG instances as NVML does (what dynamic MIG relies on)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug_nvidia._gpu._nvml import Nvml
from devplug_nvidia.discovery import discover_devices
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._structs import GpuInstanceProfileInfo

EMPTY_GPU = 3  # mig-mixed: MIG on, no instances
MIG_OFF_GPU = 4


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    nvml = FakeNvml(MODELS["mig-mixed"])
    nvml.nvmlInit()
    yield nvml
    nvml.nvmlShutdown()


def _profile(fake: FakeNvml, gpu: int, index: int) -> GpuInstanceProfileInfo:
    return fake.nvmlDeviceGetGpuInstanceProfileInfo(fake.devices[gpu], index)


def _placements(fake: FakeNvml, gpu: object, profile: GpuInstanceProfileInfo) -> list[Any]:
    """Possible placements, asked as pynvml asks: the count, then an array that size."""
    count = ctypes.c_uint(0)
    fake.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile.id, None, ctypes.pointer(count))
    array = (fake.c_nvmlGpuInstancePlacement_t * count.value)()
    fake.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile.id, array, ctypes.pointer(count))
    return list(array)


def _create(fake: FakeNvml, gpu: object, profile: GpuInstanceProfileInfo, placement: Any) -> object:
    return fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, profile.id, ctypes.pointer(placement))


def _code(error: pytest.ExceptionInfo[C.NVMLError]) -> int:
    return error.value.value


def test_possible_placements_follow_the_profile_size(fake: FakeNvml) -> None:
    gpu = fake.devices[EMPTY_GPU]
    one = _placements(fake, gpu, _profile(fake, EMPTY_GPU, 0))
    three = _placements(fake, gpu, _profile(fake, EMPTY_GPU, 2))
    assert [(p.start, p.size) for p in one] == [(i, 1) for i in range(7)]
    assert [(p.start, p.size) for p in three] == [(0, 3), (4, 3)]
    short = (fake.c_nvmlGpuInstancePlacement_t * 1)()
    with pytest.raises(C.NVMLError) as error:
        fake.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 0, short, ctypes.pointer(ctypes.c_uint(1)))
    assert _code(error) == C.NVML_ERROR_INSUFFICIENT_SIZE
    with pytest.raises(C.NVMLError) as error:
        _placements(fake, fake.devices[MIG_OFF_GPU], _profile(fake, MIG_OFF_GPU, 0))
    assert _code(error) == C.NVML_ERROR_NOT_SUPPORTED


def test_overlapping_placements_are_insufficient_resources(fake: FakeNvml) -> None:
    gpu = fake.devices[EMPTY_GPU]
    three = _profile(fake, EMPTY_GPU, 2)
    one = _profile(fake, EMPTY_GPU, 0)
    first = _placements(fake, gpu, three)[0]
    gi = _create(fake, gpu, three, first)
    for start in (0, 2):
        placement = _placements(fake, gpu, one)[start]
        with pytest.raises(C.NVMLError) as error:
            _create(fake, gpu, one, placement)
        assert _code(error) == C.NVML_ERROR_INSUFFICIENT_RESOURCES
    free = _placements(fake, gpu, one)[4]  # blocks the other 3g
    assert _create(fake, gpu, one, free) is not gi
    assert fake.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, three.id) == 0


def test_a_placement_the_profile_does_not_have_is_refused(fake: FakeNvml) -> None:
    gpu = fake.devices[EMPTY_GPU]
    three = _profile(fake, EMPTY_GPU, 2)
    odd = _placements(fake, gpu, _profile(fake, EMPTY_GPU, 0))[1]
    with pytest.raises(C.NVMLError) as error:
        _create(fake, gpu, three, odd)
    assert _code(error) == C.NVML_ERROR_INVALID_ARGUMENT


def test_a_compute_instance_is_a_mig_device_until_destroyed(fake: FakeNvml, tmp_path: Path) -> None:
    root = write_root(MODELS["mig-mixed"], tmp_path / "root")
    fake.proc_root = root / "proc"
    gpu = fake.devices[EMPTY_GPU]
    two = _profile(fake, EMPTY_GPU, 1)
    placement = _placements(fake, gpu, two)[1]
    gi = _create(fake, gpu, two, placement)
    ci_profile = fake.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, C.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0
    )
    ci = fake.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    with pytest.raises(C.NVMLError) as error:
        fake.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    assert _code(error) == C.NVML_ERROR_INSUFFICIENT_RESOURCES
    info = fake.nvmlGpuInstanceGetInfo(gi)
    assert (info.placement.start, info.placement.size) == (2, 2)

    with Nvml.open(fake) as nvml:
        records = discover_devices(nvml, sysfs=root / "sys", proc=root / "proc", details=True)
    (mig,) = [r for r in records if r.mig is not None and r.mig.parent_index == EMPTY_GPU]
    assert mig.mig is not None
    assert (mig.mig.profile, mig.mig.gpu_instance_id, mig.mig.compute_instance_id) == ("2g.10gb", info.id, 0)
    assert mig.mig.cap_paths  # the capability files exist
    caps = root / "proc/driver/nvidia/capabilities" / f"gpu{EMPTY_GPU}" / "mig" / f"gi{info.id}"
    assert (caps / "ci0" / "access").exists()

    with pytest.raises(C.NVMLError) as error:
        fake.nvmlGpuInstanceDestroy(gi)
    assert _code(error) == C.NVML_ERROR_IN_USE
    fake.nvmlComputeInstanceDestroy(ci)
    fake.nvmlGpuInstanceDestroy(gi)
    assert not fake.devices[EMPTY_GPU].instances
    assert not fake.devices[EMPTY_GPU].mig_devices
    assert not caps.exists()
    with pytest.raises(C.NVMLError) as error:
        fake.nvmlGpuInstanceDestroy(gi)
    assert _code(error) == C.NVML_ERROR_INVALID_ARGUMENT


def test_the_profile_instance_count_is_a_limit(fake: FakeNvml) -> None:
    gpu = fake.devices[EMPTY_GPU]
    me = _profile(fake, EMPTY_GPU, C.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)  # one per GPU
    placements = _placements(fake, gpu, me)
    _create(fake, gpu, me, placements[0])
    with pytest.raises(C.NVMLError) as error:
        _create(fake, gpu, me, placements[1])
    assert _code(error) == C.NVML_ERROR_INSUFFICIENT_RESOURCES
