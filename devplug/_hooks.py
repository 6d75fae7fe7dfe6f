"""What devplug reads off an author's plugin class: which optional hooks it overrides.

The framework's questions about a class live here, as functions taking the class, and not on
:class:`~devplug.DevicePlugin`: a subclass is then free to give any other name (``options``,
``prepares_claims``, ...) a meaning of its own without changing what devplug sends the kubelet.
Pure: no I/O, no protobuf.
"""

from __future__ import annotations

from typing import Literal

from devplug.models import PluginOptions
from devplug.plugin import DevicePlugin

__all__ = ["OptionalHook", "advertised_options", "overrides"]

OptionalHook = Literal[
    "preferred_allocation", "pre_start_container", "cdi_spec", "prepare_claim", "unprepare_claim"
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
