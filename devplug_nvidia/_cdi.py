"""The CDI spec NVIDIA's plugin writes at start-up, built with :mod:`devplug.cdi`.

Minimal on purpose: per device its device nodes, spec-wide the control nodes that exist, and
``NVIDIA_VISIBLE_DEVICES=void`` so that a legacy NVIDIA runtime hook injects nothing more. No
driver libraries, binaries or ldcache/symlink hooks (upstream's nvidia-container-toolkit
generator adds those); containers must get the user-space driver another way.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from devplug.cdi import CdiDevice, CdiSpec, ContainerEdits, DeviceNode, Hook, write_spec
from devplug_nvidia._allocate import CDI_KIND, CONTROL_NODES, ImexChannel

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence
    from pathlib import Path

    from devplug_nvidia._model import GpuRecord
    from devplug_nvidia.config import NvidiaSettings

__all__ = ["build_cdi_spec", "build_imex_spec", "write_cdi_spec"]


def _node(path: str, config: NvidiaSettings) -> DeviceNode:
    host = config.host_dev_path(path)
    return DeviceNode(path=path, host_path=host if host != path else None)


def _hook_args(config: NvidiaSettings, *args: str) -> tuple[str, ...]:
    # nvidia-ctk takes "hook <name>"; the standalone nvidia-cdi-hook takes "<name>".
    binary = posixpath.basename(config.nvidia_cdi_hook_path)
    return (binary, *args) if binary == "nvidia-cdi-hook" else (binary, "hook", *args)


def build_cdi_spec(
    records: Sequence[GpuRecord],
    config: NvidiaSettings,
    *,
    present: Collection[str] = CONTROL_NODES,
) -> CdiSpec:
    """The spec of kind ``k8s.device-plugin.nvidia.com/gpu``: one device per record, named by
    the device-ID strategy (a UUID or ``3`` / ``0:1``).

    Raises:
        ValueError: no records (a spec needs a device) or a name CDI does not allow.
    """
    devices = [
        CdiDevice(
            name=r.device_id(config.device_id_strategy),
            container_edits=ContainerEdits(device_nodes=tuple(_node(p, config) for p in r.device_paths)),
        )
        for r in dict((r.uuid, r) for r in records).values()
    ]
    hooks: tuple[Hook, ...] = ()
    if any(r.mig is not None for r in records):
        # The MIG capability nodes sit in /dev/nvidia-caps, which must be listable by the user.
        hooks = (
            Hook(
                hook_name="createContainer",
                path=config.nvidia_cdi_hook_path,
                args=_hook_args(config, "chmod", "--mode", "755", "--path", "/dev/nvidia-caps"),
            ),
        )
    spec = CdiSpec(
        kind=CDI_KIND,
        devices=tuple(devices),
        container_edits=ContainerEdits(
            env=("NVIDIA_VISIBLE_DEVICES=void",),
            device_nodes=tuple(_node(p, config) for p in CONTROL_NODES if p in present),
            hooks=hooks,
        ),
    )
    return spec


def build_imex_spec(imex: Sequence[ImexChannel], config: NvidiaSettings) -> CdiSpec:
    """``k8s.device-plugin.nvidia.com/imex-channel``: one device per channel."""
    return CdiSpec(
        kind=CDI_KIND.rsplit("/", 1)[0] + "/imex-channel",
        devices=tuple(
            CdiDevice(name=c.id, container_edits=ContainerEdits(device_nodes=(_node(c.path, config),)))
            for c in imex
        ),
    )


def write_cdi_spec(
    records: Sequence[GpuRecord],
    config: NvidiaSettings,
    *,
    present: Collection[str] = CONTROL_NODES,
    imex: Sequence[ImexChannel] = (),
) -> list[Path]:
    """Write the specs into ``config.cdi_dir``; returns the files written (none without records).

    Raises:
        OSError: the directory or a file could not be written.
    """
    written: list[Path] = []
    if records:
        written.append(write_spec(build_cdi_spec(records, config, present=present), config.cdi_dir))
    if imex:
        written.append(write_spec(build_imex_spec(imex, config), config.cdi_dir))
    return written
