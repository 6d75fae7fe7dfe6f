"""Real MIG profile tables (facts from NVIDIA's documentation and go-nvml's dgxa100 mock)."""

from __future__ import annotations

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._specs import GiProfile

#: A100-SXM4-40GB: 7 compute slices, 8 memory slices of ~5 GB, 14 SMs per slice.
A100_40GB_PROFILES: tuple[GiProfile, ...] = (
    #         id                                      sl  n   SM  CE dec enc jpg ofa  MB
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 7, 14, 1, 0, 0, 0, 0, 4864),
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 14, 1, 1, 0, 1, 1, 4864),
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 4, 14, 1, 1, 0, 0, 0, 9856),
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, 3, 28, 2, 1, 0, 0, 0, 9856),
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 3, 2, 42, 3, 2, 0, 0, 0, 19968),
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 4, 1, 56, 4, 2, 0, 0, 0, 19968),
    GiProfile(C.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 7, 1, 98, 7, 5, 0, 1, 1, 40192),
)

#: Compute-instance profile IDs by compute slice count.
CI_PROFILE_BY_SLICES: dict[int, int] = {
    1: C.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: C.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: C.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: C.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: C.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: C.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: C.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
