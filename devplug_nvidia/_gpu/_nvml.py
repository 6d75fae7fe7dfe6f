"""The NVML layer: the only module that touches ``pynvml``.

Everything else goes through :class:`Nvml`, which takes the module as a parameter (the real
``pynvml`` or a :class:`devplug_nvidia.testing.FakeNvml`), loads ``libnvidia-ml.so.1`` from the
driver root, and turns ``NVMLError`` into :class:`NvmlError` with a message that says what to check.
Errors are matched by their ``.value`` code, so the real and the fake classes both work.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Any

from devplug.errors import DevplugError

__all__ = [
    "LIBRARY_NAME",
    "LIBRARY_SEARCH_DIRS",
    "Nvml",
    "NvmlError",
    "import_pynvml",
    "translate_error",
]

# NVML return codes (pynvml's NVML_ERROR_* values).
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
CORRUPTED_INFOROM = 14
GPU_IS_LOST = 15
RESET_REQUIRED = 16
OPERATING_SYSTEM = 17
LIB_RM_VERSION_MISMATCH = 18
UNKNOWN = 999

LIBRARY_NAME = "libnvidia-ml.so.1"
#: Where driver installs put the library, relative to the driver root (the container toolkit's list).
LIBRARY_SEARCH_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)

_RUNTIME_HINT = (
    "the pod must run with the NVIDIA container runtime (runtimeClassName: nvidia, or nvidia as "
    "the node's default runtime) so the driver is injected"
)

_HINTS: dict[int, str] = {
    LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 could not be loaded: check that the NVIDIA driver is installed on the host, "
        "that the driver root (--driver-root / NVIDIA_DRIVER_ROOT, e.g. /run/nvidia/driver with the GPU "
        f"operator) points at it, and {_RUNTIME_HINT}"
    ),
    DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded: check `nvidia-smi` and `lsmod | grep nvidia` on the "
        "host; with the GPU operator, check that the driver daemonset is ready"
    ),
    NO_PERMISSION: (
        "no permission to talk to the NVIDIA driver: the plugin needs read/write access to "
        f"/dev/nvidiactl and /dev/nvidia*; run it privileged or with those devices, and {_RUNTIME_HINT}"
    ),
    UNINITIALIZED: "NVML was used before nvmlInit or after nvmlShutdown (a bug in the caller)",
    FUNCTION_NOT_FOUND: "the installed driver is too old for this NVML call: upgrade the NVIDIA driver",
    GPU_IS_LOST: (
        "the GPU has fallen off the bus or is otherwise inaccessible: check `dmesg` for Xid 79; "
        "the GPU needs a reset or the node a reboot"
    ),
    LIB_RM_VERSION_MISMATCH: (
        "libnvidia-ml and the loaded kernel module are different driver versions: reboot (or reload "
        "the module) after a driver upgrade, and check the driver root points at the running driver"
    ),
    CORRUPTED_INFOROM: "the GPU's infoROM is corrupted: the GPU needs service (nvidia-smi -q shows it)",
    RESET_REQUIRED: "the GPU needs a reset (nvidia-smi -r) or the node a reboot",
    OPERATING_SYSTEM: "the operating system refused the NVML call: check dmesg and the device nodes",
    NOT_SUPPORTED: "this GPU or driver does not support the call",
    NOT_FOUND: "NVML found no such object",
    INVALID_ARGUMENT: "NVML rejected an argument",
    TIMEOUT: "the NVML call timed out",
}


class NvmlError(DevplugError):
    """An NVML call failed; ``code`` is NVML's return code, the message says what to check."""

    def __init__(self, message: str, *, code: int, call: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        """NVML's return code (``NVML_ERROR_*``), e.g. 12 for library not found."""
        self.call = call
        """The NVML function that failed, when known."""


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def translate_error(exc: BaseException, call: str | None = None) -> NvmlError:
    """The :class:`NvmlError` for an ``NVMLError`` (real or fake), with a what-to-check hint."""
    code = _error_code(exc)
    code = UNKNOWN if code is None else code
    where = f"{call} failed" if call else "NVML call failed"
    hint = _HINTS.get(code)
    message = f"{where}: {exc} (NVML error {code})"
    return NvmlError(f"{message}; {hint}" if hint else message, code=code, call=call)


def import_pynvml() -> Any:
    """The real ``pynvml`` module, imported on first use.

    Raises:
        NvmlError: nvidia-ml-py is not installed (code LIBRARY_NOT_FOUND).
    """
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        raise NvmlError(
            "the pynvml module is missing: install devplug with the nvidia extra "
            "(pip install 'devplug[nvidia]', which brings nvidia-ml-py)",
            code=LIBRARY_NOT_FOUND,
        ) from None
    return pynvml


def find_library(driver_root: str | Path) -> Path:
    """``libnvidia-ml.so.1`` under ``driver_root`` (first of :data:`LIBRARY_SEARCH_DIRS` that has it).

    Raises:
        NvmlError: not found (code LIBRARY_NOT_FOUND); the message lists where it looked.
    """
    root = Path(driver_root)
    for directory in LIBRARY_SEARCH_DIRS:
        candidate = root / directory / LIBRARY_NAME
        if candidate.exists():
            return candidate
    searched = ", ".join(str(root / d) for d in LIBRARY_SEARCH_DIRS)
    raise NvmlError(
        f"{LIBRARY_NAME} not found under the driver root {root} (searched {searched}); "
        f"{_HINTS[LIBRARY_NOT_FOUND]}",
        code=LIBRARY_NOT_FOUND,
    )


class Nvml:
    """An initialised NVML: call functions by name, get :class:`NvmlError` on failure.

    Use :meth:`open` (or ``with Nvml.open(...) as nvml``); :meth:`close` shuts NVML down.
    """

    def __init__(self, module: Any) -> None:
        self.module = module
        """The ``pynvml`` module or a fake standing in for it."""
        self._open = False

    @classmethod
    def open(cls, module: Any = None, *, driver_root: str | Path | None = None) -> Nvml:
        """Load the library (from ``driver_root`` when it is not ``/``) and call ``nvmlInit``.

        Args:
            module: ``pynvml`` or a fake; None imports ``pynvml``.
            driver_root: where the host's driver lives in this container; None or ``/`` lets the
                dynamic loader find the library as usual.

        Raises:
            NvmlError: the module or library is missing, or ``nvmlInit`` failed.
        """
        nvml = cls(import_pynvml() if module is None else module)
        if driver_root is not None and Path(driver_root) != Path("/"):
            nvml._load(find_library(driver_root))
        nvml.call("nvmlInit")
        nvml._open = True
        return nvml

    def _load(self, path: Path) -> None:
        # pynvml loads the library on nvmlInit only when ``nvmlLib`` is still None, so setting it
        # first makes it use ours. A module may bring its own loader (the fake does).
        loader = getattr(self.module, "load_library", None) or ctypes.CDLL
        try:
            self.module.nvmlLib = loader(str(path))
        except OSError as exc:
            raise NvmlError(
                f"{path} could not be loaded: {exc}; {_HINTS[LIBRARY_NOT_FOUND]}", code=LIBRARY_NOT_FOUND
            ) from exc

    def call(self, function: str, *args: Any) -> Any:
        """Call NVML function ``function`` (e.g. ``"nvmlDeviceGetCount"``) with ``args``.

        Raises:
            NvmlError: the call failed (``code`` says how).
        """
        func = getattr(self.module, function, None)
        if func is None:
            raise NvmlError(
                f"{function} is not in the NVML bindings: upgrade nvidia-ml-py", code=FUNCTION_NOT_FOUND
            )
        try:
            return func(*args)
        except self.module.NVMLError as exc:
            raise translate_error(exc, function) from exc

    def const(self, name: str) -> int:
        """The value of NVML constant ``name`` (e.g. ``"NVML_TOPOLOGY_SYSTEM"``) in the module."""
        return int(getattr(self.module, name))

    def close(self) -> None:
        """``nvmlShutdown``; safe to call twice, errors are swallowed (nothing to do about them)."""
        if self._open:
            self._open = False
            with contextlib.suppress(self.module.NVMLError):
                self.module.nvmlShutdown()

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
