"""The machine models: one table per model, built from facts about real machines (nvidia.md §12)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._profiles import A100_40GB_PROFILES
from devplug_nvidia.testing._specs import GpuSpec, MachineModel, MigInstance, NvLink

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_SWITCH = C.NVML_NVLINK_DEVICE_TYPE_SWITCH


def _bus(bus: int) -> str:
    return f"00000000:{bus:02X}:00.0"


def _levels(n: int, level: Callable[[int, int], int]) -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(C.NVML_TOPOLOGY_INTERNAL if i == j else level(min(i, j), max(i, j)) for j in range(n))
        for i in range(n)
    )


def _gpus(
    gpu: GpuSpec,
    buses: Sequence[int],
    numa: Sequence[int | None] | None = None,
    nvlinks: Sequence[tuple[NvLink, ...] | None] | None = None,
) -> tuple[GpuSpec, ...]:
    """A model's GPUs, alike but for where they sit: ``gpu`` at each PCI bus of ``buses``.

    ``gpu``'s own ``bus_id`` is left empty. ``numa`` and ``nvlinks`` give each GPU's NUMA node and
    links in the order of ``buses``; without them every GPU keeps ``gpu``'s. A ``gpu`` with a
    module ID makes the GPUs modules 1, 2, ... in that order (an HGX board's slots).
    """
    return tuple(
        replace(
            gpu,
            bus_id=_bus(bus),
            numa_node=gpu.numa_node if numa is None else numa[index],
            nvlinks=gpu.nvlinks if nvlinks is None else nvlinks[index],
            module_id=None if gpu.module_id is None else index + 1,
        )
        for index, bus in enumerate(buses)
    )


def _switch_links(switches: tuple[str, ...], per_switch: tuple[int, ...]) -> tuple[NvLink, ...]:
    return tuple(
        NvLink(switch, _SWITCH)
        for switch, count in zip(switches, per_switch, strict=True)
        for _ in range(count)
    )


# -- DGX A100: 8 x A100-SXM4-40GB, 12 NVLinks each through 6 NVSwitches; GPU pairs share a PCIe
#    switch (PXB); NUMA 3,3,1,1,7,7,5,5 (AMD Rome, 8 NUMA nodes).
_A100 = "NVIDIA A100-SXM4-40GB"
_DGXA100_BUS = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_DGXA100_NUMA = (3, 3, 1, 1, 7, 7, 5, 5)
_DGXA100_SWITCHES = tuple(_bus(b) for b in (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9))


def _pair_level(i: int, j: int) -> int:
    return C.NVML_TOPOLOGY_MULTIPLE if i // 2 == j // 2 else C.NVML_TOPOLOGY_SYSTEM


DGX_A100 = MachineModel(
    name="dgx-a100",
    description="8 x A100-SXM4-40GB on NVSwitch (NV12), NUMA 3/1/7/5 by pair",
    gpus=_gpus(
        GpuSpec(
            name=_A100,
            memory_mib=40960,
            compute_capability=(8, 0),
            bus_id="",
            nvlinks=_switch_links(_DGXA100_SWITCHES, (2, 2, 2, 2, 2, 2)),
            mig_capable=True,
            gi_profiles=A100_40GB_PROFILES,
            module_id=1,
        ),
        _DGXA100_BUS,
        numa=_DGXA100_NUMA,
    ),
    levels=_levels(8, _pair_level),
    switch_bus_ids=_DGXA100_SWITCHES,
)

# -- DGX H100: 8 x H100 80GB HBM3, 18 NVLinks each over 4 NVSwitches (5/4/4/5); NUMA 0 and 1.
_DGXH100_SWITCHES = tuple(_bus(b) for b in (0xA5, 0xA6, 0xA7, 0xA8))
DGX_H100 = MachineModel(
    name="dgx-h100",
    description="8 x H100 80GB HBM3 on NVSwitch (NV18), GPU0-3 NUMA 0, GPU4-7 NUMA 1",
    gpus=_gpus(
        GpuSpec(
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            compute_capability=(9, 0),
            bus_id="",
            nvlinks=_switch_links(_DGXH100_SWITCHES, (5, 4, 4, 5)),
            mig_capable=True,
            module_id=1,
        ),
        (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
    ),
    levels=_levels(8, lambda i, j: C.NVML_TOPOLOGY_NODE if i // 4 == j // 4 else C.NVML_TOPOLOGY_SYSTEM),
    driver_version="560.35.03",
    cuda_driver_version=12060,
    switch_bus_ids=_DGXH100_SWITCHES,
)

# -- PCIe box: 4 x A10, no NVLink. GPU0/1 behind one PCIe switch (PIX) on NUMA 0; GPU2/3 on
#    two root ports of NUMA 1 (NODE); across sockets SYS.
_PCIE_LEVELS = {(0, 1): C.NVML_TOPOLOGY_SINGLE, (2, 3): C.NVML_TOPOLOGY_NODE}
PCIE_A10 = MachineModel(
    name="pcie-a10",
    description="4 x A10 on PCIe, two NUMA nodes, PIX/NODE/SYS, no NVLink",
    gpus=_gpus(
        GpuSpec(name="NVIDIA A10", memory_mib=23028, compute_capability=(8, 6), bus_id="", nvlinks=None),
        (0x17, 0x18, 0xB1, 0xCA),
        numa=(0, 0, 1, 1),
    ),
    levels=_levels(4, lambda i, j: _PCIE_LEVELS.get((i, j), C.NVML_TOPOLOGY_SYSTEM)),
)

# -- NVLink-bridged box: 4 x V100-SXM2 in a hybrid cube mesh, one socket (sysfs says -1).
#    NV2 between 0-1 and 2-3, NV1 on the other pairs; PCIe pairs (0,2) and (1,3) share a switch,
#    so the best NVLink pair and the best PCIe pair disagree.
_V100_BUS = (0x07, 0x08, 0x0E, 0x0F)
_V100_LINKS = {(0, 1): 2, (2, 3): 2, (0, 2): 1, (1, 3): 1, (0, 3): 1, (1, 2): 1}


def _mesh_links(index: int) -> tuple[NvLink, ...]:
    links = [
        NvLink(_bus(_V100_BUS[j if i == index else i]))
        for (i, j), count in sorted(_V100_LINKS.items())
        if index in (i, j)
        for _ in range(count)
    ]
    # V100 has 6 links; the unwired ones report disabled.
    links += [NvLink(_bus(0), active=False)] * (6 - len(links))
    return tuple(links)


NVLINK_V100 = MachineModel(
    name="nvlink-v100",
    description="4 x V100-SXM2-16GB hybrid cube mesh (NV2/NV1 direct links), no NUMA affinity",
    gpus=_gpus(
        GpuSpec(name="Tesla V100-SXM2-16GB", memory_mib=16160, compute_capability=(7, 0), bus_id=""),
        _V100_BUS,
        nvlinks=[_mesh_links(index) for index in range(len(_V100_BUS))],
    ),
    levels=_levels(
        4, lambda i, j: C.NVML_TOPOLOGY_SINGLE if (i, j) in ((0, 2), (1, 3)) else C.NVML_TOPOLOGY_HOSTBRIDGE
    ),
    driver_version="535.183.01",
    cuda_driver_version=12020,
)


def _a100(index: int, *instances: MigInstance, enabled: bool = True) -> GpuSpec:
    return GpuSpec(
        name=_A100,
        memory_mib=40960,
        compute_capability=(8, 0),
        bus_id=_bus(_DGXA100_BUS[index]),
        numa_node=_DGXA100_NUMA[index],
        mig_capable=True,
        mig_enabled=enabled,
        mig_instances=instances,
        gi_profiles=A100_40GB_PROFILES,
    )


_G = MigInstance
_P1, _P1ME, _P1X2 = (
    C.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    C.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    C.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
)
_P2, _P3, _P4 = (
    C.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    C.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    C.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
)

MIG_MIXED = MachineModel(
    name="mig-mixed",
    description="5 x A100-40GB: 7x1g.5gb | 4g.20gb+2g.10gb+1g.5gb+me | 3g.20gb as 1c+2c, 2g.10gb, "
    "1g.10gb | MIG on, no instances | MIG off",
    gpus=(
        _a100(0, *[_G(_P1)] * 7),
        _a100(1, _G(_P4), _G(_P2), _G(_P1ME)),
        _a100(2, _G(_P3, (1, 2)), _G(_P2), _G(_P1X2)),
        _a100(3),
        _a100(4, enabled=False),
    ),
    levels=_levels(5, _pair_level),
)

MIG_UNIFORM = MachineModel(
    name="mig-uniform",
    description="2 x A100-40GB, each split into 7 x 1g.5gb (what the single strategy accepts)",
    gpus=(_a100(0, *[_G(_P1)] * 7), _a100(1, *[_G(_P1)] * 7)),
    levels=_levels(2, _pair_level),
)

# -- An old box: 2 x Tesla K80 (one board, two GPUs): events NOT_SUPPORTED, no NVLink, no MIG.
LEGACY_K80 = MachineModel(
    name="legacy-k80",
    description="2 x Tesla K80 on one board: event registration NOT_SUPPORTED, no NVLink, no MIG",
    gpus=_gpus(
        GpuSpec(
            name="Tesla K80",
            memory_mib=11441,
            compute_capability=(3, 7),
            bus_id="",
            numa_node=0,
            nvlinks=None,
            events_supported=False,
        ),
        (0x05, 0x06),
    ),
    levels=_levels(2, lambda i, j: C.NVML_TOPOLOGY_INTERNAL),
    driver_version="470.256.02",
    cuda_driver_version=11040,
)

MODELS: dict[str, MachineModel] = {
    model.name: model
    for model in (DGX_A100, DGX_H100, PCIE_A10, NVLINK_V100, MIG_MIXED, MIG_UNIFORM, LEGACY_K80)
}
