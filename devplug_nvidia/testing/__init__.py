"""A fake NVML for tests and demos: machine models that answer like the ``pynvml`` module.

``FakeNvml(MODELS["dgx-a100"])`` goes wherever ``pynvml`` would; :func:`write_root` writes the
matching ``/proc``, ``/sys`` and ``/dev`` files under a directory.
"""

from __future__ import annotations

from devplug_nvidia.testing._errors import NVMLError
from devplug_nvidia.testing._events import WHOLE_GPU, EventSet
from devplug_nvidia.testing._fake import FakeNvml
from devplug_nvidia.testing._machines import (
    DGX_A100,
    DGX_H100,
    LEGACY_K80,
    MIG_MIXED,
    MIG_UNIFORM,
    MODELS,
    NVLINK_V100,
    PCIE_A10,
)
from devplug_nvidia.testing._profiles import A100_40GB_PROFILES
from devplug_nvidia.testing._root import mig_cap_minor, mig_minors_text, write_root
from devplug_nvidia.testing._specs import GiProfile, GpuSpec, MachineModel, MigInstance, NvLink, stable_uuid

__all__ = [
    "A100_40GB_PROFILES",
    "DGX_A100",
    "DGX_H100",
    "LEGACY_K80",
    "MIG_MIXED",
    "MIG_UNIFORM",
    "MODELS",
    "NVLINK_V100",
    "PCIE_A10",
    "WHOLE_GPU",
    "EventSet",
    "FakeNvml",
    "GiProfile",
    "GpuSpec",
    "MachineModel",
    "MigInstance",
    "NVMLError",
    "NvLink",
    "fake_nvml",
    "mig_cap_minor",
    "mig_minors_text",
    "stable_uuid",
    "write_root",
]


def fake_nvml(model: str | MachineModel, *, init_error: int | None = None) -> FakeNvml:
    """A :class:`FakeNvml` for a model given by name (a key of :data:`MODELS`) or as data.

    Raises:
        KeyError: no model of that name (the message lists the known ones).
    """
    if isinstance(model, str):
        if model not in MODELS:
            raise KeyError(f"unknown fake NVML model {model!r}; known: {', '.join(sorted(MODELS))}")
        model = MODELS[model]
    return FakeNvml(model, init_error=init_error)
