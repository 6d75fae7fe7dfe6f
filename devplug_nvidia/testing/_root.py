"""Writes the files a fake machine's host would have under one root directory.

``<root>/proc/driver/nvidia-caps/mig-minors``, the NVSwitches in
``<root>/proc/driver/nvidia-nvswitch/devices/<bus>``, the MIG capability files of the instances that
exist (``<root>/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access``) with the
``nvidia-caps`` major in ``<root>/proc/devices``, ``<root>/sys/bus/pci/devices/<bus>/{numa_node,class}``,
``<root>/sys/class/dmi/id/product_name`` (the model's name), ``<root>/dev/nvidia*`` stand-ins
(plain empty files), and a user-space driver of the model's
version: libraries (``libnvidia-ml.so.1`` and ``lib*.so.<version>``) under
``<root>/usr/lib/x86_64-linux-gnu``, binaries under ``<root>/usr/bin``, GSP firmware and the
persistenced socket, so discovery, Allocate and CDI specs can be pointed at it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from devplug.topology import normalize_pci_bus_id
from devplug_nvidia.testing._handles import build_devices

if TYPE_CHECKING:
    import os

    from devplug_nvidia.testing._specs import MachineModel

#: GPU-instance IDs and compute-instance IDs the driver reserves capabilities for.
_GI_IDS = 15
_CI_IDS = 8
_PER_GI = 1 + _CI_IDS
_PER_GPU = _GI_IDS * _PER_GI
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-ml.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-encode.so",
    "libnvcuvid.so",
    "libnvidia-opticalflow.so",
)
"""Libraries written as ``<name>.<driver version>`` (plus ``vdpau/libvdpau_nvidia.so.<version>``)."""
PRODUCT_NAME_FILE = "sys/class/dmi/id/product_name"
"""The DMI product name (gpu-feature-discovery's machine type), relative to the root."""
NVIDIA_CAPS_MAJOR = 235
"""The character-device major ``<root>/proc/devices`` gives ``nvidia-caps`` (dynamic on real hosts)."""
CAP_FILE_MODE = 0o444
"""``DeviceFileMode`` of the MIG capability files (the driver writes it in decimal: 292)."""
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control")
GSP_FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


def mig_cap_minor(gpu_minor: int, gpu_instance_id: int, compute_instance_id: int | None = None) -> int:
    """The ``nvidia-cap<N>`` minor the driver lists for a GI (or a CI inside it) in mig-minors."""
    gi_minor = 3 + gpu_minor * _PER_GPU + gpu_instance_id * _PER_GI
    return gi_minor if compute_instance_id is None else gi_minor + 1 + compute_instance_id


def mig_minors_text(gpu_count: int) -> str:
    """The contents of ``/proc/driver/nvidia-caps/mig-minors`` for ``gpu_count`` GPUs."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpu_count):
        for gi in range(_GI_IDS):
            lines.append(f"gpu{gpu}/gi{gi}/access {mig_cap_minor(gpu, gi)}")
            lines.extend(
                f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_cap_minor(gpu, gi, ci)}" for ci in range(_CI_IDS)
            )
    return "\n".join(lines) + "\n"


def write_root(model: MachineModel, root: str | os.PathLike[str]) -> Path:
    """Create the host files of ``model`` under ``root`` (made if missing); returns the root.

    ``/dev`` nodes are empty regular files: enough for code that checks they exist.
    """
    base = Path(root)
    caps = base / "proc" / "driver" / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    (caps / "mig-minors").write_text(mig_minors_text(len(model.gpus)))
    if model.switch_bus_ids:
        switches = base / "proc" / "driver" / "nvidia-nvswitch" / "devices"
        switches.mkdir(parents=True, exist_ok=True)
        for bus in model.switch_bus_ids:
            (switches / normalize_pci_bus_id(bus)).write_text(f"Bus: {normalize_pci_bus_id(bus)}\n")
    for spec in model.gpus:
        device = base / "sys" / "bus" / "pci" / "devices" / normalize_pci_bus_id(spec.bus_id)
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{-1 if spec.numa_node is None else spec.numa_node}\n")
        (device / "class").write_text(f"0x{spec.pci_class:06x}\n")
    product_name = base / PRODUCT_NAME_FILE
    product_name.parent.mkdir(parents=True, exist_ok=True)
    product_name.write_text(f"{model.name}\n")
    dev = base / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    nodes = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
    nodes += [f"nvidia{minor}" for minor in range(len(model.gpus))]
    nodes += ["nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"]
    for minor, spec in enumerate(model.gpus):
        if spec.mig_enabled:
            # The driver creates cap nodes for the instances that exist; covering every ID is simpler
            # and harmless for a stand-in.
            nodes += [
                f"nvidia-caps/nvidia-cap{mig_cap_minor(minor, gi, ci)}"
                for gi in range(_GI_IDS)
                for ci in (None, *range(_CI_IDS))
            ]
    for node in nodes:
        (dev / node).touch()
    _write_capabilities(base, model)
    _write_driver(base, model.driver_version)
    return base


def _write_capabilities(base: Path, model: MachineModel) -> None:
    """``/proc/devices`` and, per GPU and compute instance that exists, the capability file the
    driver creates with it (``DeviceFileMinor`` as in mig-minors)."""
    proc = base / "proc"
    (proc / "devices").write_text(
        "Character devices:\n  1 mem\n  4 tty\n195 nvidia-frontend\n"
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  7 loop\n  8 sd\n"
    )
    caps = proc / "driver" / "nvidia" / "capabilities"
    for device in build_devices(model):
        for gi in device.instances:
            folder = caps / f"gpu{device.index}" / "mig" / f"gi{gi.id}"
            _write_cap(folder / "access", mig_cap_minor(device.index, gi.id))
            for ci in gi.compute_instances:
                _write_cap(folder / f"ci{ci.id}" / "access", mig_cap_minor(device.index, gi.id, ci.id))


def write_instance_capabilities(proc: Path, gpu: int, gpu_instance: int, compute_instance: int) -> None:
    """The capability files the driver creates with a new compute instance (and its GPU instance)
    under ``proc`` (the fake's ``/proc``)."""
    folder = proc / "driver" / "nvidia" / "capabilities" / f"gpu{gpu}" / "mig" / f"gi{gpu_instance}"
    if not (folder / "access").exists():
        _write_cap(folder / "access", mig_cap_minor(gpu, gpu_instance))
    minor = mig_cap_minor(gpu, gpu_instance, compute_instance)
    _write_cap(folder / f"ci{compute_instance}" / "access", minor)


def remove_instance_capabilities(
    proc: Path, gpu: int, gpu_instance: int, compute_instance: int | None
) -> None:
    """Remove what :func:`write_instance_capabilities` wrote: a compute instance's file, or (None)
    the GPU instance's whole folder."""
    folder = proc / "driver" / "nvidia" / "capabilities" / f"gpu{gpu}" / "mig" / f"gi{gpu_instance}"
    if compute_instance is not None:
        (folder / f"ci{compute_instance}" / "access").unlink(missing_ok=True)
        if (folder / f"ci{compute_instance}").is_dir():
            (folder / f"ci{compute_instance}").rmdir()
        return
    (folder / "access").unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _write_cap(path: Path, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: {CAP_FILE_MODE}\nDeviceFileModify: 1\n")


def _write_driver(base: Path, version: str) -> None:
    lib = base / LIBRARY_DIR
    (lib / "vdpau").mkdir(parents=True, exist_ok=True)
    for name in ("libnvidia-ml.so.1", "libcuda.so.1", *(f"{n}.{version}" for n in DRIVER_LIBRARIES)):
        (lib / name).touch()
    (lib / "vdpau" / f"libvdpau_nvidia.so.{version}").touch()
    (lib / "libnvidia-nvvm70.so.4").touch()
    bin_dir = base / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for binary in DRIVER_BINARIES:
        (bin_dir / binary).touch(mode=0o755)
    firmware = base / "lib" / "firmware" / "nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    for name in GSP_FIRMWARE:
        (firmware / name).touch()
    socket = base / "var" / "run" / "nvidia-persistenced"
    socket.mkdir(parents=True, exist_ok=True)
    (socket / "socket").touch()
