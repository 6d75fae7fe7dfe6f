"""What every part of the fake NVML shares: init state, injected failures, handle checks."""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._handles import Device, MigDevice, build_devices

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from devplug_nvidia.testing._specs import MachineModel

P = ParamSpec("P")
R = TypeVar("R")
Self = TypeVar("Self", bound="FakeBase")


def api(
    func: Callable[Concatenate[Self, P], R],
) -> Callable[Concatenate[Self, P], R]:
    """Mark an NVML function: checks initialisation and injected failures first, as NVML would."""

    @functools.wraps(func)
    def wrapper(self: Self, *args: P.args, **kwargs: P.kwargs) -> R:
        self._enter(func.__name__)
        return func(self, *args, **kwargs)

    return cast("Callable[Concatenate[Self, P], R]", wrapper)


class FakeBase:
    """State shared by the fake's API groups (see :class:`FakeNvml`)."""

    def __init__(self, model: MachineModel, *, init_error: int | None = None) -> None:
        self.model = model
        self.devices: list[Device] = build_devices(model)
        self.nvmlLib: Any = None
        self.loaded_library: str | None = None
        """The path :meth:`load_library` was called with (what ``_nvml`` chose under the driver root)."""
        self.calls: list[str] = []
        """The NVML functions called, in order (for tests asserting on what was asked)."""
        self._init_error = init_error
        self._init_count = 0
        self._failures: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self.proc_root: Path | None = None
        """Where this machine's ``/proc`` is (a fake root's ``proc``): compute instances created
        through NVML get their capability files there, as the driver writes them."""

    # -- test controls ------------------------------------------------------------------------

    def fail(self, function: str, code: int, *, times: int = 1) -> None:
        """Make the next ``times`` calls of NVML function ``function`` raise the error ``code``."""
        self._failures.setdefault(function, []).extend([code] * times)

    def load_library(self, path: str) -> object:
        """Stand-in for ``ctypes.CDLL``: records the path, loads nothing."""
        self.loaded_library = path
        return object()

    # -- shared helpers ------------------------------------------------------------------------

    def _enter(self, function: str) -> None:
        with self._lock:
            self.calls.append(function)
            queued = self._failures.get(function)
            code = queued.pop(0) if queued else None
        if code is not None:
            raise C.NVMLError(code)
        if function != "nvmlInit" and self._init_count == 0:
            raise C.NVMLError_Uninitialized()

    def _gpu(self, handle: object, *, allow_mig: bool = False) -> Device:
        """The full GPU behind ``handle`` (the parent for a MIG handle when ``allow_mig``)."""
        if isinstance(handle, MigDevice) and allow_mig:
            handle = handle.parent
        if not isinstance(handle, Device) or handle not in self.devices:
            raise C.NVMLError_InvalidArgument()
        if handle.lost:
            raise C.NVMLError_GpuIsLost()
        return handle

    def _any(self, handle: object) -> Device | MigDevice:
        if isinstance(handle, MigDevice):
            self._gpu(handle.parent)
            return handle
        return self._gpu(handle)
