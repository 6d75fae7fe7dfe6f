"""The CDI spec NVIDIA's plugin writes at start-up, built with :mod:`devplug.cdi`.

Per device its device nodes; spec-wide the control nodes that exist,
``NVIDIA_VISIBLE_DEVICES=void`` (so a legacy NVIDIA runtime hook injects nothing more) and, as
NVIDIA's generator does, the user-space driver: its libraries, binaries, GSP firmware and IPC
sockets mounted read-only, then the ``create-symlinks`` and ``update-ldcache`` hooks through the
configured ``nvidia-ctk``. Driver files are found where this process sees the driver
(``--driver-root-ctr-path`` when that directory exists, else ``--driver-root``) and mounted from
their host path under ``--driver-root``, as upstream's root transform does.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

import structlog

from devplug.cdi import VERSIONS, CdiDevice, CdiMount, CdiSpec, ContainerEdits, DeviceNode, Hook, write_spec
from devplug_nvidia._container._allocate import CDI_KIND, CONTROL_NODES, ImexChannel
from devplug_nvidia._container._cdi_driver import DriverFiles, find_driver_files

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence
    from pathlib import Path

    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia.config import NvidiaSettings

__all__ = [
    "MOUNT_OPTIONS",
    "build_cdi_spec",
    "build_imex_spec",
    "common_edits",
    "device_node",
    "driver_edits",
    "driver_view",
    "write_cdi_spec",
]

log = structlog.get_logger(__name__)

MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
"""Options of every driver-file mount (upstream's)."""
# Links applications expect that the driver's packages do not always ship:
# (library name prefix, link target, link name; None: the library's own name).
_EXTRA_LINKS: tuple[tuple[str, str | None, str], ...] = (
    ("libcuda.so", "libcuda.so.1", "libcuda.so"),
    ("libGLX_nvidia.so", None, "libGLX_indirect.so.0"),
    ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so"),
)


def device_node(path: str, config: NvidiaSettings) -> DeviceNode:
    """The device node ``path`` (``/dev/nvidia0``), from its host path under the dev root."""
    host = config.host_dev_path(path)
    return DeviceNode(path=path, host_path=host if host != path else None)


def _hook_args(config: NvidiaSettings, *args: str) -> tuple[str, ...]:
    # nvidia-ctk takes "hook <name>"; the standalone nvidia-cdi-hook takes "<name>".
    binary = posixpath.basename(config.nvidia_cdi_hook_path)
    return (binary, *args) if binary == "nvidia-cdi-hook" else (binary, "hook", *args)


def driver_view(config: NvidiaSettings) -> str:
    """Where this process sees the host's driver root: ``--driver-root-ctr-path`` when that
    directory exists (the plugin runs in a container with the root mounted there), else
    ``--driver-root`` (running on the host, or a test tree)."""
    return config.driver_root_ctr_path if os.path.isdir(config.driver_root_ctr_path) else config.driver_root


def _host_path(config: NvidiaSettings, path: str) -> str:
    return posixpath.join(config.driver_root, path.lstrip("/"))


def _symlink_args(libraries: Sequence[str]) -> list[str]:
    args: list[str] = []
    done: set[str] = set()
    for lib in libraries:
        name = posixpath.basename(lib)
        for prefix, target, link in _EXTRA_LINKS:
            if name.startswith(prefix) and link not in done:
                done.add(link)
                args += ["--link", f"{target or name}::{posixpath.join(posixpath.dirname(lib), link)}"]
    return args


def driver_edits(files: DriverFiles, config: NvidiaSettings) -> tuple[tuple[CdiMount, ...], tuple[Hook, ...]]:
    """The mounts of the driver files (host path under ``--driver-root``, the same path in the
    container, read-only) and the ``create-symlinks`` / ``update-ldcache`` hooks."""
    mounts = tuple(
        CdiMount(host_path=_host_path(config, p), container_path=p, options=MOUNT_OPTIONS)
        for p in files.mounts
    )
    hooks: list[Hook] = []
    if links := _symlink_args(files.libraries):
        hooks.append(
            Hook(
                hook_name="createContainer",
                path=config.nvidia_cdi_hook_path,
                args=_hook_args(config, "create-symlinks", *links),
            )
        )
    folders = [
        a for d in dict.fromkeys(posixpath.dirname(p) for p in files.libraries) for a in ("--folder", d)
    ]
    hooks.append(
        Hook(
            hook_name="createContainer",
            path=config.nvidia_cdi_hook_path,
            args=_hook_args(config, "update-ldcache", *folders),
        )
    )
    return mounts, tuple(hooks)


def common_edits(
    config: NvidiaSettings,
    *,
    present: Collection[str] = CONTROL_NODES,
    driver: DriverFiles | None = None,
    hooks: Sequence[Hook] = (),
) -> ContainerEdits:
    """What a container gets with any device of a spec: ``NVIDIA_VISIBLE_DEVICES=void``, the
    control nodes in ``present``, the ``driver`` files and their hooks (none without), then
    ``hooks``."""
    mounts: tuple[CdiMount, ...] = ()
    driver_hooks: tuple[Hook, ...] = ()
    if driver is not None:
        mounts, driver_hooks = driver_edits(driver, config)
    return ContainerEdits(
        env=("NVIDIA_VISIBLE_DEVICES=void",),
        device_nodes=tuple(device_node(p, config) for p in CONTROL_NODES if p in present),
        mounts=mounts,
        hooks=driver_hooks + tuple(hooks),
    )


def build_cdi_spec(
    records: Sequence[GpuRecord],
    config: NvidiaSettings,
    *,
    present: Collection[str] = CONTROL_NODES,
    driver: DriverFiles | None = None,
) -> CdiSpec:
    """The spec of kind ``k8s.device-plugin.nvidia.com/gpu``: one device per record, named by
    the device-ID strategy (a UUID or ``3`` / ``0:1``); ``driver``: the driver files to mount
    (none: device nodes only).

    Raises:
        ValueError: no records (a spec needs a device), a name CDI does not allow, or a spec
            needing a cdiVersion devplug does not know.
    """
    devices = [
        CdiDevice(
            name=r.device_id(config.device_id_strategy),
            container_edits=ContainerEdits(
                device_nodes=tuple(device_node(p, config) for p in r.device_paths)
            ),
        )
        for r in dict((r.uuid, r) for r in records).values()
    ]
    hooks: tuple[Hook, ...] = ()
    if any(r.mig is not None for r in records):
        # The MIG capability nodes sit in /dev/nvidia-caps, which must be listable by the user.
        hooks += (
            Hook(
                hook_name="createContainer",
                path=config.nvidia_cdi_hook_path,
                args=_hook_args(config, "chmod", "--mode", "755", "--path", "/dev/nvidia-caps"),
            ),
        )
    spec = CdiSpec(
        kind=CDI_KIND,
        devices=tuple(devices),
        container_edits=common_edits(config, present=present, driver=driver, hooks=hooks),
    )
    if spec.required_version() not in VERSIONS:
        raise ValueError(f"CDI spec needs cdiVersion {spec.required_version()}, not one of {VERSIONS}")
    return spec


def build_imex_spec(imex: Sequence[ImexChannel], config: NvidiaSettings) -> CdiSpec:
    """``k8s.device-plugin.nvidia.com/imex-channel``: one device per channel."""
    return CdiSpec(
        kind=CDI_KIND.rsplit("/", 1)[0] + "/imex-channel",
        devices=tuple(
            CdiDevice(name=c.id, container_edits=ContainerEdits(device_nodes=(device_node(c.path, config),)))
            for c in imex
        ),
    )


def write_cdi_spec(
    records: Sequence[GpuRecord],
    config: NvidiaSettings,
    *,
    present: Collection[str] = CONTROL_NODES,
    imex: Sequence[ImexChannel] = (),
    driver: DriverFiles | None = None,
    driver_version: str | None = None,
) -> list[Path]:
    """Write the specs into ``config.cdi_dir``; returns the files written (none without records).

    ``driver``: the driver files to mount; by default they are found under :func:`driver_view`
    for ``driver_version`` (NVML's; default: the versioned NVML library's suffix).

    Raises:
        OSError: the directory or a file could not be written.
    """
    written: list[Path] = []
    if records:
        if driver is None:
            driver = find_driver_files(driver_view(config), driver_version)
            if driver is None:
                log.warning(
                    "cdi_driver_files_not_found",
                    root=driver_view(config),
                    note="the spec injects device nodes only; containers need the driver another way",
                )
        spec = build_cdi_spec(records, config, present=present, driver=driver)
        written.append(write_spec(spec, config.cdi_dir))
    if imex:
        written.append(write_spec(build_imex_spec(imex, config), config.cdi_dir))
    return written
