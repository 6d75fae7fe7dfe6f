"""What devplug reads off an author's plugin class: which optional hooks it overrides.

The framework's questions about a class live here, as functions taking the class, and not on
:class:`~devplug.DevicePlugin`: a subclass is then free to give any other name (``options``,
``prepares_claims``, ...) a meaning of its own without changing what devplug sends the kubelet.
Pure: no I/O, no protobuf.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

from devplug.models import PluginOptions
from devplug.plugin import DevicePlugin

__all__ = ["OptionalHook", "advertised_options", "hook_problem", "overrides"]

OptionalHook = Literal[
    "preferred_allocation",
    "pre_start_container",
    "cdi_spec",
    "prepare_claim",
    "unprepare_claim",
    "release_device",
]
"""The hooks of :class:`~devplug.DevicePlugin` that are called only when a subclass overrides them."""


def overrides(cls: type[DevicePlugin], hook: OptionalHook) -> bool:
    """Whether ``cls`` (a :class:`~devplug.DevicePlugin` subclass) overrides ``hook``."""
    return getattr(cls, hook) is not getattr(DevicePlugin, hook)


def advertised_options(cls: type[DevicePlugin]) -> PluginOptions:
    """The options advertised to the kubelet for ``cls``: one per optional hook it overrides."""
    return PluginOptions(
        pre_start_required=overrides(cls, "pre_start_container"),
        get_preferred_allocation_available=overrides(cls, "preferred_allocation"),
    )


# The optional hooks devplug awaits, by API (besides allocate, which it awaits under both).
_AWAITED: dict[str, tuple[OptionalHook, ...]] = {
    "device-plugin": ("preferred_allocation", "pre_start_container"),
    "dra": ("prepare_claim", "unprepare_claim", "release_device"),
}


def hook_problem(cls: type[DevicePlugin], api: str) -> str | None:
    """Why a hook of ``cls`` cannot work when served through ``api`` (``device-plugin`` or
    ``dra``), or None: what would otherwise fail at the first call, or be retried for ever.

    Refused: a ``watch_devices`` written as a plain generator or as an ``async def`` that does
    not yield (``async for`` can iterate neither); a hook devplug awaits written as a generator,
    or as a plain ``def`` not declared to return an awaitable (one that is may hand on another
    coroutine); a ``cdi_spec`` (called, not awaited) written as an ``async def``. A plain
    ``def watch_devices`` may return any async iterator, and is accepted.
    """
    watch = inspect.unwrap(cls.watch_devices)
    if inspect.isgeneratorfunction(watch):
        return "watch_devices is a plain generator: write it as 'async def' with 'yield'"
    if inspect.iscoroutinefunction(watch):
        return "watch_devices is an 'async def' that does not yield: it must yield the device sets"
    for hook in ["allocate", *(h for h in _AWAITED[api] if overrides(cls, h))]:
        function = inspect.unwrap(getattr(cls, hook))
        if inspect.isasyncgenfunction(function) or inspect.isgeneratorfunction(function):
            return f"{hook} is a generator: write it as 'async def' that returns its answer"
        plain = inspect.isfunction(function) and not inspect.iscoroutinefunction(function)
        if plain and not _returns_awaitable(function):
            return f"{hook} must be an 'async def': devplug awaits it"
    if api == "device-plugin" and overrides(cls, "cdi_spec"):
        spec = inspect.unwrap(cls.cdi_spec)
        if inspect.iscoroutinefunction(spec) or inspect.isasyncgenfunction(spec):
            return "cdi_spec must be a plain 'def': devplug calls it without awaiting"
    return None


def _returns_awaitable(function: Any) -> bool:
    """Whether a plain function says it returns an awaitable (it may hand on another coroutine)."""
    annotation = getattr(function, "__annotations__", {}).get("return")
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return any(word in text for word in ("Awaitable", "Coroutine", "Future"))
