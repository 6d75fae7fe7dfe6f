"""Allocate responses as NVIDIA's device plugin builds them: records + config → allocation.

Pure: what exists on the host (optional control nodes, IMEX channels) is looked up once at
start-up by :func:`present_nodes` / :func:`imex_channels` and passed in.
"""

from __future__ import annotations

import posixpath
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from devplug.models import ContainerAllocation, DeviceSpec, Mount

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence
    from pathlib import Path

    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia.config import NvidiaSettings

__all__ = [
    "CDI_KIND",
    "CDI_VENDOR",
    "CONTROL_NODES",
    "ImexChannel",
    "build_allocation",
    "imex_channels",
    "present_nodes",
    "strip_replica",
]

CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_KIND = f"{CDI_VENDOR}/gpu"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
"""Passed only when they exist, in this order, before the per-device nodes."""
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST = "/dev/null"
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"
IMEX_DIR = "/dev/nvidia-caps-imex-channels"
MPS_CONTAINER_ROOT = "/mps"


@dataclass(frozen=True)
class ImexChannel:
    """An IMEX channel device node to inject (``/dev/nvidia-caps-imex-channels/channel0``)."""

    id: str

    @property
    def path(self) -> str:
        return f"{IMEX_DIR}/channel{self.id}"


def strip_replica(device_id: str) -> str:
    """``GPU-x::3`` → ``GPU-x`` (time-slicing / MPS replica suffix)."""
    return device_id.split("::", 1)[0]


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def present_nodes(dev_root_view: Path) -> frozenset[str]:
    """The optional control nodes that exist under ``dev_root_view`` (where this process sees
    the host's dev root)."""
    return frozenset(p for p in CONTROL_NODES if _under(dev_root_view, p).exists())


def imex_channels(ids: Sequence[int], dev_root_view: Path, *, required: bool) -> tuple[ImexChannel, ...]:
    """The configured IMEX channels whose node exists; a missing one is skipped unless required.

    Raises:
        FileNotFoundError: a required channel's device node does not exist.
    """
    found: list[ImexChannel] = []
    for channel in (ImexChannel(str(i)) for i in ids):
        if _under(dev_root_view, channel.path).exists():
            found.append(channel)
        elif required:
            raise FileNotFoundError(
                f"required IMEX channel {channel.path} does not exist under {dev_root_view}"
            )
    return tuple(found)


def _unique(records: Sequence[GpuRecord]) -> list[GpuRecord]:
    seen: dict[str, GpuRecord] = {}
    for record in records:
        seen.setdefault(record.uuid, record)
    return list(seen.values())


def build_allocation(
    records: Sequence[GpuRecord],
    config: NvidiaSettings,
    *,
    resource_name: str = "nvidia.com/gpu",
    present: Collection[str] = CONTROL_NODES,
    imex: Sequence[ImexChannel] = (),
    response_id: str | None = None,
) -> ContainerAllocation:
    """What one container gets for ``records`` (the requested devices, replicas resolved, in
    request order; duplicates are dropped).

    ``present``: the optional control nodes that exist on the host; ``imex``: the IMEX channels
    found at start-up; ``response_id``: the suffix of the CDI annotation key (upstream: a new
    random UUID per response).
    """
    unique = _unique(records)
    ids = [r.device_id(config.device_id_strategy) for r in unique]
    strategies = set(config.device_list_strategy)
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []

    if config.any_cdi:
        names = [f"{CDI_KIND}={i}" for i in ids]
        names += [f"{CDI_VENDOR}/imex-channel={c.id}" for c in imex]
        if names and "cdi-annotations" in strategies:
            key = f"{config.cdi_annotation_prefix}nvidia-device-plugin_{response_id or uuid.uuid4()}"
            annotations[key] = ",".join(names)
        if "cdi-cri" in strategies:
            cdi_devices = names
    if config.sharing.strategy == "mps" and config.mps_root:
        pipe = posixpath.join(MPS_CONTAINER_ROOT, resource_name, "pipe")
        envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
        mounts.append(
            Mount(container_path=pipe, host_path=posixpath.join(config.mps_root, resource_name, "pipe"))
        )
        mounts.append(Mount(container_path="/dev/shm", host_path=posixpath.join(config.mps_root, "shm")))  # noqa: S108 - the MPS shm mount
    # Upstream sets these before the CDI-only early return: CDI-only responses carry them too.
    if config.gdrcopy_enabled:
        envs["NVIDIA_GDRCOPY"] = "enabled"
    if config.gds_enabled:
        envs["NVIDIA_GDS"] = "enabled"
    if config.mofed_enabled:
        envs["NVIDIA_MOFED"] = "enabled"

    devices: list[DeviceSpec] = []
    if not config.cdi_only:
        if "envvar" in strategies:
            envs[VISIBLE_DEVICES] = ",".join(ids)
            if imex:
                envs[IMEX_ENV] = ",".join(c.id for c in imex)
        if "volume-mounts" in strategies:
            envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
            mounts += [
                Mount(host_path=VOLUME_MOUNTS_HOST, container_path=posixpath.join(VOLUME_MOUNTS_ROOT, i))
                for i in ids
            ]
            mounts += [
                Mount(
                    host_path=VOLUME_MOUNTS_HOST,
                    container_path=posixpath.join(VOLUME_MOUNTS_ROOT, "imex", c.id),
                )
                for c in imex
            ]
        if config.pass_device_specs:
            paths = [p for p in CONTROL_NODES if p in present]
            paths += [p for r in unique for p in r.device_paths]
            paths += [c.path for c in imex]
            devices = [
                DeviceSpec(container_path=p, host_path=config.host_dev_path(p), permissions="rw")
                for p in dict.fromkeys(paths)
            ]
    return ContainerAllocation(
        envs=envs,
        mounts=tuple(mounts),
        devices=tuple(devices),
        annotations=annotations,
        cdi_devices=tuple(cdi_devices),
    )
