"""The fake NVML: parity with pynvml, models, MIG trees, events, root files."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from devplug_nvidia.testing import (
    MODELS,
    WHOLE_GPU,
    EventSet,
    FakeNvml,
    NVMLError,
    fake_nvml,
    mig_cap_minor,
    write_root,
)

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the nvidia extra) is not installed")


def _started(model: str) -> FakeNvml:
    fake = fake_nvml(model)
    fake.nvmlInit()
    return fake


def test_every_nvml_name_of_the_fake_exists_in_pynvml() -> None:
    fake = fake_nvml("dgx-a100")
    names = [n for n in dir(fake) if n.startswith(("nvml", "NVML"))]
    assert len(names) > 80
    missing = [n for n in names if not hasattr(pynvml, n)]
    assert missing == []


def test_constants_have_pynvml_values() -> None:
    fake = fake_nvml("dgx-a100")
    for name in dir(fake):
        if name.startswith(("NVML_", "nvmlEventType")):
            assert getattr(fake, name) == getattr(pynvml, name), name


@pytest.mark.parametrize(
    "name",
    [
        "NVMLError_NotSupported",
        "NVMLError_NotFound",
        "NVMLError_LibraryNotFound",
        "NVMLError_DriverNotLoaded",
        "NVMLError_NoPermission",
        "NVMLError_GpuIsLost",
        "NVMLError_Timeout",
        "NVMLError_Uninitialized",
        "NVMLError_FunctionNotFound",
        "NVMLError_InvalidArgument",
        "NVMLError_Unknown",
    ],
)
def test_error_classes_match_pynvml(name: str) -> None:
    fake = fake_nvml("dgx-a100")
    ours, theirs = getattr(fake, name)(), getattr(pynvml, name)()
    assert ours.value == theirs.value
    assert str(ours) == str(theirs)
    assert isinstance(ours, fake.NVMLError)
    assert type(NVMLError(theirs.value)).__name__ == name


def test_calls_before_init_raise_uninitialized() -> None:
    fake = fake_nvml("pcie-a10")
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_init_error_and_injected_failures() -> None:
    fake = fake_nvml("pcie-a10", init_error=12)
    with pytest.raises(fake.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    fake = _started("pcie-a10")
    fake.fail("nvmlDeviceGetCount", 9, times=2)
    for _ in range(2):
        with pytest.raises(fake.NVMLError_DriverNotLoaded):
            fake.nvmlDeviceGetCount()
    assert fake.nvmlDeviceGetCount() == 4


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="dgx-a100"):
        fake_nvml("nope")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_models_are_stable_and_consistent(model: str) -> None:
    a, b = _started(model), _started(model)
    count = a.nvmlDeviceGetCount()
    assert count == len(MODELS[model].gpus)
    uuids = [a.nvmlDeviceGetUUID(a.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    assert uuids == [b.nvmlDeviceGetUUID(b.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    assert len(set(uuids)) == count
    for i in range(count):
        handle = a.nvmlDeviceGetHandleByIndex(i)
        assert a.nvmlDeviceGetMinorNumber(handle) == i
        bus = a.nvmlDeviceGetPciInfo(handle).busId
        assert len(bus.split(":")[0]) == 8
        assert a.nvmlDeviceGetHandleByUUID(uuids[i]) is handle
        for j in range(count):
            other = a.nvmlDeviceGetHandleByIndex(j)
            level = a.nvmlDeviceGetTopologyCommonAncestor(handle, other)
            assert level == a.nvmlDeviceGetTopologyCommonAncestor(other, handle)


def test_dgx_a100_links_reach_nvswitches() -> None:
    fake = _started("dgx-a100")
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    gpu_buses = {fake.nvmlDeviceGetPciInfo(fake.nvmlDeviceGetHandleByIndex(i)).busId for i in range(8)}
    remote = []
    for link in range(fake.NVML_NVLINK_MAX_LINKS):
        try:
            if fake.nvmlDeviceGetNvLinkState(handle, link) != fake.NVML_FEATURE_ENABLED:
                continue
        except fake.NVMLError_NotSupported:
            continue
        assert fake.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == fake.NVML_NVLINK_DEVICE_TYPE_SWITCH
        remote.append(fake.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
    assert len(remote) == 12
    assert gpu_buses.isdisjoint(remote)
    other = fake.nvmlDeviceGetHandleByIndex
    assert fake.nvmlDeviceGetTopologyCommonAncestor(other(0), other(1)) == fake.NVML_TOPOLOGY_MULTIPLE
    assert fake.nvmlDeviceGetTopologyCommonAncestor(other(0), other(2)) == fake.NVML_TOPOLOGY_SYSTEM


def test_v100_mesh_has_direct_links_of_different_counts() -> None:
    fake = _started("nvlink-v100")
    buses = [fake.nvmlDeviceGetPciInfo(fake.nvmlDeviceGetHandleByIndex(i)).busId for i in range(4)]
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    counts: dict[str, int] = {}
    for link in range(6):
        if fake.nvmlDeviceGetNvLinkState(handle, link) == fake.NVML_FEATURE_ENABLED:
            assert fake.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == fake.NVML_NVLINK_DEVICE_TYPE_GPU
            bus = fake.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
            counts[bus] = counts.get(bus, 0) + 1
    assert counts == {buses[1]: 2, buses[2]: 1, buses[3]: 1}
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceGetNvLinkState(handle, 6)


def test_pcie_box_has_no_nvlink_and_three_levels() -> None:
    fake = _started("pcie-a10")
    h = fake.nvmlDeviceGetHandleByIndex
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceGetNvLinkState(h(0), 0)
    levels = {fake.nvmlDeviceGetTopologyCommonAncestor(h(i), h(j)) for i in range(4) for j in range(i + 1, 4)}
    assert levels == {fake.NVML_TOPOLOGY_SINGLE, fake.NVML_TOPOLOGY_NODE, fake.NVML_TOPOLOGY_SYSTEM}


def test_mig_tree_and_empty_slots() -> None:
    fake = _started("mig-mixed")
    gpu = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetMigMode(gpu) == [1, 1]
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert fake.nvmlDeviceIsMigDeviceHandle(mig)
    assert fake.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) is gpu
    assert fake.nvmlDeviceGetUUID(mig).startswith("MIG-")
    attrs = fake.nvmlDeviceGetAttributes(mig)
    assert (attrs.gpuInstanceSliceCount, attrs.memorySizeMB, attrs.multiprocessorCount) == (4, 19968, 56)
    gi = fake.nvmlDeviceGetGpuInstanceById(gpu, fake.nvmlDeviceGetGpuInstanceId(mig))
    assert fake.nvmlGpuInstanceGetInfo(gi).profileId == fake.NVML_GPU_INSTANCE_PROFILE_4_SLICE
    ci = fake.nvmlGpuInstanceGetComputeInstanceById(gi, fake.nvmlDeviceGetComputeInstanceId(mig))
    assert fake.nvmlComputeInstanceGetInfo(ci).profileId == fake.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE
    with pytest.raises(fake.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 3)
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7)
    info = fake.nvmlDeviceGetGpuInstanceProfileInfo(gpu, fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert (info.instanceCount, info.memorySizeMB) == (7, 4864)
    pcie = _started("pcie-a10")
    with pytest.raises(pcie.NVMLError_NotSupported):
        pcie.nvmlDeviceGetMigMode(pcie.nvmlDeviceGetHandleByIndex(0))


def _event_set(fake: FakeNvml, gpu: int = 0) -> EventSet:
    event_set = fake.nvmlEventSetCreate()
    handle = fake.nvmlDeviceGetHandleByIndex(gpu)
    fake.nvmlDeviceRegisterEvents(handle, fake.nvmlDeviceGetSupportedEventTypes(handle), event_set)
    return event_set


def test_event_wait_times_out_after_blocking() -> None:
    fake = _started("dgx-a100")
    event_set = _event_set(fake)
    start = time.monotonic()
    with pytest.raises(fake.NVMLError_Timeout):
        fake.nvmlEventSetWait(event_set, 200)
    assert 0.15 < time.monotonic() - start < 2


def test_event_wait_wakes_for_an_xid_from_another_thread() -> None:
    fake = _started("mig-mixed")
    event_set = _event_set(fake, gpu=1)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(fake.nvmlEventSetWait(event_set, 10_000)))
    start = time.monotonic()
    waiter.start()
    time.sleep(0.05)
    assert fake.push_xid(1, 48, gpu_instance_id=1, compute_instance_id=0) == 1
    waiter.join(5)
    assert time.monotonic() - start < 2
    (event,) = got
    assert event.eventType == fake.nvmlEventTypeXidCriticalError
    assert (event.eventData, event.gpuInstanceId, event.computeInstanceId) == (48, 1, 0)
    assert event.device is fake.nvmlDeviceGetHandleByIndex(1)


def test_events_ecc_timeout_lost_and_unregistered() -> None:
    fake = _started("dgx-a100")
    event_set = _event_set(fake, gpu=2)
    assert fake.push_xid(5, 79) == 0  # GPU 5 is not registered: dropped
    fake.push_ecc(2)
    assert fake.nvmlEventSetWait(event_set, 1000).eventType == fake.nvmlEventTypeDoubleBitEccError
    fake.push_timeout()
    with pytest.raises(fake.NVMLError_Timeout):
        fake.nvmlEventSetWait(event_set, 10_000)
    fake.lose_gpu(3)
    with pytest.raises(fake.NVMLError_GpuIsLost):
        fake.nvmlEventSetWait(event_set, 10_000)
    with pytest.raises(fake.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUUID(fake.devices[3])
    fake.nvmlEventSetFree(event_set)


def test_whole_gpu_event_ids() -> None:
    fake = _started("dgx-h100")
    event_set = _event_set(fake)
    fake.push_xid(0, 31)
    event = fake.nvmlEventSetWait(event_set, 1000)
    assert (event.gpuInstanceId, event.computeInstanceId) == (WHOLE_GPU, WHOLE_GPU)


def test_old_gpu_event_registration_not_supported() -> None:
    fake = _started("legacy-k80")
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake.NVMLError_NotSupported):
        fake.nvmlDeviceRegisterEvents(handle, fake.nvmlEventTypeXidCriticalError, fake.nvmlEventSetCreate())


def test_write_root(tmp_path: Path) -> None:
    model = MODELS["mig-mixed"]
    write_root(model, tmp_path)
    minors = (tmp_path / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    assert minors[:2] == ["config 1", "monitor 2"]
    assert f"gpu1/gi13/access {mig_cap_minor(1, 13)}" in minors
    assert f"gpu2/gi1/ci1/access {mig_cap_minor(2, 1, 1)}" in minors
    assert (tmp_path / "sys/bus/pci/devices/0000:07:00.0/numa_node").read_text().strip() == "3"
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia4"):
        assert (tmp_path / "dev" / node).exists()
    assert (tmp_path / f"dev/nvidia-caps/nvidia-cap{mig_cap_minor(0, 7, 0)}").exists()
    write_root(MODELS["nvlink-v100"], tmp_path / "v100")
    assert (tmp_path / "v100/sys/bus/pci/devices/0000:07:00.0/numa_node").read_text().strip() == "-1"
