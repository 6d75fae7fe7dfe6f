"""The link matrix: PCIe levels and NVLink counts from the fake NVML, NVSwitch systems, lost GPUs."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import pytest
from structlog.testing import capture_logs

from devplug_nvidia._gpu._links import LEVEL_SCORES, GpuLinks, LinkMatrix, read_links
from devplug_nvidia._gpu._nvml import Nvml
from devplug_nvidia.testing import MODELS, FakeNvml, NvLink, fake_nvml
from devplug_nvidia.testing import _errors as C
from tests.nvidia.nvidia_upstream import degraded_dgx_a100, upstream_nvlinks


def _read(fake: FakeNvml) -> LinkMatrix:
    with Nvml.open(fake) as nvml:
        return read_links(nvml)


def _uuids(fake: FakeNvml) -> list[str]:
    return [fake.model.gpu_uuid(i) for i in range(len(fake.model.gpus))]


def test_level_scores_are_upstreams() -> None:
    assert LEVEL_SCORES == {
        C.NVML_TOPOLOGY_SYSTEM: 10,
        C.NVML_TOPOLOGY_NODE: 20,
        C.NVML_TOPOLOGY_HOSTBRIDGE: 30,
        C.NVML_TOPOLOGY_MULTIPLE: 40,
        C.NVML_TOPOLOGY_SINGLE: 50,
        C.NVML_TOPOLOGY_INTERNAL: 60,
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_levels_match_the_model(name: str) -> None:
    fake = fake_nvml(name)
    matrix = _read(fake)
    uuids = _uuids(fake)
    assert matrix.gpus == tuple(uuids)
    assert not matrix.lost
    for i, j in combinations(range(len(uuids)), 2):
        assert matrix.levels[frozenset((uuids[i], uuids[j]))] == fake.model.levels[i][j]


@pytest.mark.parametrize(("name", "links"), [("dgx-a100", 12), ("dgx-h100", 18)])
def test_nvswitch_systems_are_fully_connected(name: str, links: int) -> None:
    fake = fake_nvml(name)
    matrix = _read(fake)
    uuids = _uuids(fake)
    for a, b in combinations(uuids, 2):
        assert matrix.links(a, b) == links
        level = fake.model.levels[uuids.index(a)][uuids.index(b)]
        assert matrix.score(a, b) == LEVEL_SCORES[level] + 100 * links
    # Counting links to the peer's bus ID, as upstream does, finds none through NVSwitches.
    assert set(upstream_nvlinks(fake).values()) == {0}


def test_direct_nvlinks_of_the_v100_mesh() -> None:
    fake = fake_nvml("nvlink-v100")
    matrix = _read(fake)
    u = _uuids(fake)
    expected = {(0, 1): 2, (2, 3): 2, (0, 2): 1, (1, 3): 1, (0, 3): 1, (1, 2): 1}
    for (i, j), count in expected.items():
        assert matrix.links(u[i], u[j]) == count
    # Direct links are what upstream counts too: here both views agree.
    assert {k: v for k, v in upstream_nvlinks(fake).items() if v} == {
        frozenset((u[i], u[j])): n for (i, j), n in expected.items()
    }
    assert matrix.score(u[0], u[1]) == 30 + 200
    assert matrix.score(u[0], u[2]) == 50 + 100


@pytest.mark.parametrize("name", ["pcie-a10", "legacy-k80", "mig-mixed"])
def test_no_nvlink_machines_score_pcie_only(name: str) -> None:
    fake = fake_nvml(name)
    matrix = _read(fake)
    assert not matrix.nvlinks
    u = _uuids(fake)
    assert matrix.score(u[0], u[1]) == LEVEL_SCORES[fake.model.levels[0][1]]


def test_degraded_switch_links_count_per_switch() -> None:
    fake = FakeNvml(degraded_dgx_a100())
    matrix = _read(fake)
    u = _uuids(fake)
    assert matrix.links(u[4], u[5]) == 6  # GPU 5 lost its links to three of the six switches
    assert matrix.links(u[3], u[4]) == 12
    assert matrix.score(u[3], u[4]) > matrix.score(u[4], u[5])


def test_two_switch_islands_are_not_connected() -> None:
    base = MODELS["dgx-h100"]
    island = ("00000000:E0:00.0",)
    gpus = tuple(
        replace(g, nvlinks=tuple(NvLink(island[0], C.NVML_NVLINK_DEVICE_TYPE_SWITCH) for _ in range(18)))
        if i >= 4
        else g
        for i, g in enumerate(base.gpus)
    )
    fake = FakeNvml(replace(base, gpus=gpus))
    matrix = _read(fake)
    u = _uuids(fake)
    assert matrix.links(u[0], u[1]) == 18
    assert matrix.links(u[4], u[5]) == 18
    assert matrix.links(u[0], u[4]) == 0


def test_a_gpu_lost_before_start_up_is_left_out() -> None:
    fake = fake_nvml("dgx-a100")
    with Nvml.open(fake) as nvml:
        fake.lose_gpu(3)
        with capture_logs() as logs:
            matrix = read_links(nvml)
    u = _uuids(fake)
    assert u[3] not in matrix.gpus
    assert len(matrix.gpus) == 7
    assert matrix.links(u[0], u[1]) == 12
    assert any(e["event"] == "gpu_links_unreadable" for e in logs)


def test_a_gpu_lost_while_reading_links_gets_none() -> None:
    fake = fake_nvml("dgx-a100")
    fake.fail("nvmlDeviceGetNvLinkState", C.NVML_ERROR_GPU_IS_LOST)  # the first GPU's first link
    with capture_logs() as logs:
        matrix = _read(fake)
    u = _uuids(fake)
    assert matrix.lost == {u[0]}
    assert all(matrix.score(u[0], x) == 0 for x in u[1:])
    assert matrix.links(u[1], u[2]) == 12
    assert any(e["event"] == "gpu_links_lost" for e in logs)


def test_unreadable_level_and_link_are_skipped() -> None:
    fake = fake_nvml("nvlink-v100")
    fake.fail("nvmlDeviceGetTopologyCommonAncestor", C.NVML_ERROR_UNKNOWN)
    fake.fail("nvmlDeviceGetNvLinkRemotePciInfo", C.NVML_ERROR_UNKNOWN)
    with capture_logs() as logs:
        matrix = _read(fake)
    u = _uuids(fake)
    assert frozenset((u[0], u[1])) not in matrix.levels  # the first pair asked
    assert len(matrix.levels) == 5
    # GPU 0's first link (to GPU 1) was unreadable: the counts differ, the smaller is kept.
    assert matrix.links(u[0], u[1]) == 1
    events = {e["event"] for e in logs}
    assert {"topology_level_unreadable", "nvlink_unreadable", "nvlink_counts_differ"} <= events


def test_missing_remote_device_type_counts_links_as_direct() -> None:
    fake = fake_nvml("nvlink-v100")
    fake.fail("nvmlDeviceGetNvLinkRemoteDeviceType", C.NVML_ERROR_FUNCTION_NOT_FOUND, times=100)
    matrix = _read(fake)
    u = _uuids(fake)
    assert matrix.links(u[0], u[1]) == 2


def test_without_drops_links_and_levels() -> None:
    fake = fake_nvml("dgx-h100")
    matrix = _read(fake)
    u = _uuids(fake)
    smaller = matrix.without([u[2]])
    assert smaller.lost == {u[2]}
    assert smaller.score(u[2], u[3]) == 0
    assert smaller.score(u[0], u[1]) == matrix.score(u[0], u[1])
    assert smaller.without([u[2]]) is smaller
    assert matrix.without(["GPU-unknown"]) is matrix


def test_build_from_facts_and_describe() -> None:
    a = GpuLinks("GPU-a", "0000:01:00.0", gpu_peers={"0000:02:00.0": 4})
    b = GpuLinks("GPU-b", "0000:02:00.0", gpu_peers={"0000:01:00.0": 4})
    c = GpuLinks("GPU-c", "0000:03:00.0", lost=True)
    levels = {frozenset(("GPU-a", "GPU-b")): C.NVML_TOPOLOGY_SINGLE, frozenset(("GPU-a", "GPU-c")): 0}
    matrix = LinkMatrix.build([a, b, c], levels)
    assert matrix.score("GPU-a", "GPU-b") == 450
    assert matrix.score("GPU-a", "GPU-c") == 0
    assert matrix.score("GPU-a", "GPU-a") == 0
    assert matrix.set_score(["GPU-a", "GPU-b", "GPU-c", "GPU-a"]) == 450
    assert matrix.describe() == {"gpus": 3, "lost": [2], "nvlinks": {"0-1": 4}, "levels": {"0-1": 10}}
