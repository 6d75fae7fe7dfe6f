"""MIG helpers of discovery: profile names computed from NVML's numbers, and the mig-minors file."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import os

__all__ = ["mig_cap_paths", "mig_profile_name", "read_mig_minors"]

_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024

# GPU-instance profile IDs (NVML_GPU_INSTANCE_PROFILE_*) that carry a media-engine or graphics
# attribute in the profile name; plain slice profiles (and 1_SLICE_REV2, the double-memory 1g)
# carry none.
_GI_PROFILE_SUFFIX: dict[int, str] = {
    0x7: "+me",  # 1_SLICE_REV1
    0x8: "+me",  # 2_SLICE_REV1
    0xA: "+gfx",  # 1_SLICE_GFX
    0xB: "+gfx",  # 2_SLICE_GFX
    0xC: "+gfx",  # 4_SLICE_GFX
    0x11: "+gfx",  # 3_SLICE_GFX
    0xD: "-me",  # 1_SLICE_NO_ME
    0xE: "-me",  # 2_SLICE_NO_ME
    0xF: "+me.all",  # 1_SLICE_ALL_ME
    0x10: "+me.all",  # 2_SLICE_ALL_ME
}


def mig_memory_gb(memory_mb: int, parent_memory_bytes: int) -> int:
    """The ``<GB>`` of a MIG profile name, computed as NVIDIA does.

    The MIG memory as a fraction of the parent's, rounded up to eighths, times the parent's
    memory in GiB (rounded up), rounded to the nearest integer (halves away from zero).
    """
    if parent_memory_bytes <= 0:
        raise ValueError(f"parent memory must be positive, got {parent_memory_bytes}")
    fraction = Fraction(memory_mb * _MIB, parent_memory_bytes)
    eighths = Fraction(math.ceil(fraction * 8), 8)
    total_gb = -(-parent_memory_bytes // _GIB)
    return math.floor(eighths * total_gb + Fraction(1, 2))


def mig_profile_name(
    *,
    gpu_slices: int,
    compute_slices: int,
    memory_mb: int,
    parent_memory_bytes: int,
    gi_profile_id: int | None = None,
) -> str:
    """A MIG profile name: ``<G>g.<GB>gb``, or ``<C>c.<G>g.<GB>gb`` when the compute instance is
    smaller than its GPU instance, plus ``+me`` / ``+me.all`` / ``+gfx`` / ``-me`` from the
    GPU-instance profile ID.

    Raises:
        ValueError: ``parent_memory_bytes`` is not positive.
    """
    gb = mig_memory_gb(memory_mb, parent_memory_bytes)
    name = f"{gpu_slices}g.{gb}gb"
    if compute_slices != gpu_slices:
        name = f"{compute_slices}c.{name}"
    return name + _GI_PROFILE_SUFFIX.get(gi_profile_id if gi_profile_id is not None else -1, "")


def read_mig_minors(proc: str | os.PathLike[str] = "/proc") -> dict[str, int] | None:
    """``<proc>/driver/nvidia-caps/mig-minors`` as ``{"gpu0/gi1/access": 12, ...}``; None if absent."""
    path = Path(proc) / "driver" / "nvidia-caps" / "mig-minors"
    try:
        text = path.read_text()
    except OSError:
        return None
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def mig_cap_paths(minors: dict[str, int], gpu_minor: int, gi: int, ci: int) -> tuple[str, ...]:
    """The GI and CI access capability nodes of a MIG device (``/dev/nvidia-caps/nvidia-cap<N>``).

    Raises:
        KeyError: the file has no entry for this GI or CI.
    """
    gi_key = f"gpu{gpu_minor}/gi{gi}/access"
    ci_key = f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"
    return tuple(f"/dev/nvidia-caps/nvidia-cap{minors[key]}" for key in (gi_key, ci_key))
