"""The user-space driver files a CDI spec mounts into containers, found under a driver root.

What NVIDIA's CDI generator (nvidia-container-toolkit's nvcdi, used by NVIDIA's device plugin)
puts in a ``nvidia.com/gpu``-style spec: every library in the driver's library directories whose
name ends in ``.so.<driver version>`` (libcuda, libnvidia-ml, libnvidia-ptxjitcompiler, ...,
including the ``vdpau`` subdirectory), the legacy ``libnvidia-nvvm70.so.*``, the driver's
binaries, the GSP firmware of that version and the IPC sockets that exist.

Pure apart from reading the directory tree: :func:`find_driver_files` takes the root where this
process sees the driver installation and returns root-relative paths (``/usr/bin/nvidia-smi``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BINARIES",
    "IPC_PATHS",
    "LIBRARY_DIRS",
    "DriverFiles",
    "driver_version_from_libraries",
    "find_driver_files",
]

LIBRARY_DIRS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib",
    "/lib",
)
"""Where the driver's libraries are looked for (and their ``vdpau`` subdirectories), in order."""
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
"""The driver's binaries, mounted when present (the first found in :data:`BINARY_DIRS`)."""
FIRMWARE_DIRS = ("/lib/firmware/updates", "/lib/firmware")
IPC_PATHS = (
    "/var/run/nvidia-persistenced/socket",
    "/var/run/nvidia-fabricmanager/socket",
    "/tmp/nvidia-mps",  # noqa: S108 - the MPS daemon's default pipe directory on the host
)
"""IPC sockets / directories of the driver's daemons, mounted when present."""
_LEGACY_NVVM = re.compile(r"^libnvidia-nvvm70\.so\..+$")
_NVML_VERSIONED = re.compile(r"^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class DriverFiles:
    """Driver files found under a driver root, as root-relative absolute paths."""

    version: str
    """The driver version, e.g. ``550.54.15``."""
    libraries: tuple[str, ...] = ()
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    ipc: tuple[str, ...] = ()

    @property
    def mounts(self) -> tuple[str, ...]:
        """Every path to mount, libraries first."""
        return self.libraries + self.binaries + self.firmware + self.ipc


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _library_dirs(root: Path) -> list[str]:
    """The library directories that exist, each real directory once (merged-/usr systems link
    ``/lib`` to ``/usr/lib``: the first spelling wins)."""
    seen: set[str] = set()
    found: list[str] = []
    for base in LIBRARY_DIRS:
        for rel in (base, f"{base}/vdpau"):
            path = _under(root, rel)
            if not path.is_dir():
                continue
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                found.append(rel)
    return found


def driver_version_from_libraries(root: str | os.PathLike[str]) -> str | None:
    """The driver version from the versioned NVML library (``libnvidia-ml.so.550.54.15``) under
    ``root``; None when there is none."""
    base = Path(root)
    for rel in _library_dirs(base):
        for name in sorted(os.listdir(_under(base, rel))):
            if match := _NVML_VERSIONED.match(name):
                return match.group(1)
    return None


def find_driver_files(root: str | os.PathLike[str], version: str | None = None) -> DriverFiles | None:
    """The driver files under ``root`` for driver ``version`` (default: read from the versioned
    NVML library); None when the version cannot be told or no library of it exists."""
    base = Path(root)
    version = version or driver_version_from_libraries(base)
    if not version:
        return None
    suffix = f".so.{version}"
    libraries: list[str] = []
    for rel in _library_dirs(base):
        for name in sorted(os.listdir(_under(base, rel))):
            if (name.endswith(suffix) or _LEGACY_NVVM.match(name)) and not _under(
                base, f"{rel}/{name}"
            ).is_dir():
                libraries.append(f"{rel}/{name}")
    if not any(lib.endswith(suffix) for lib in libraries):
        return None
    binaries = []
    for binary in BINARIES:
        for directory in BINARY_DIRS:
            if _under(base, f"{directory}/{binary}").is_file():
                binaries.append(f"{directory}/{binary}")
                break
    firmware: list[str] = []
    for directory in FIRMWARE_DIRS:
        folder = _under(base, f"{directory}/nvidia/{version}")
        if folder.is_dir():
            firmware += [f"{directory}/nvidia/{version}/{p.name}" for p in sorted(folder.glob("gsp*.bin"))]
    ipc = [p for p in IPC_PATHS if _under(base, p).exists()]
    return DriverFiles(
        version=version,
        libraries=tuple(libraries),
        binaries=tuple(binaries),
        firmware=tuple(firmware),
        ipc=tuple(ipc),
    )
