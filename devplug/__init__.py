"""devplug: Kubernetes device plugins in async Python.

Subclass :class:`DevicePlugin`, then ``devplug.run(MyPlugin())``: devplug serves it on a unix
socket, registers it with the kubelet, streams the device list and its health, answers
allocations, and registers again whenever the kubelet restarts.

Building blocks, each its own module: :mod:`devplug.policies` (preferred-allocation policies),
:mod:`devplug.topology` (NUMA nodes from sysfs), :mod:`devplug.cdi` (CDI spec files),
:mod:`devplug.health` (health policy) and :mod:`devplug.checks` (host-path checks). What only a
DRA driver uses (claims, counter sets, device taints) is in :mod:`devplug.dra`.

The names below are imported on first use (``from devplug import Device`` or
``devplug.Device``): ``import devplug`` alone loads none of pydantic, structlog or grpc, so a
command's start and a plugin's imports pay only for what they use.
"""

from __future__ import annotations

import typing

from devplug._lazy import lazy_names as _lazy_names

if typing.TYPE_CHECKING:
    from devplug._device_plugin.resource import ResourceStatus
    from devplug._device_plugin.runner import Plugins, PluginSource, Runner
    from devplug._main import run, serve
    from devplug._runtime.signals import install_signals, run_async
    from devplug.checks import HostPathError
    from devplug.errors import ConfigError, DevplugError, KubeletError, RegistrationError
    from devplug.health import HealthPolicy, HealthSettings
    from devplug.models import (
        ContainerAllocation,
        Device,
        DeviceSpec,
        Health,
        Mount,
        PluginOptions,
        Version,
    )
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings, load_settings

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ContainerAllocation",
    "Device",
    "DevicePlugin",
    "DeviceSpec",
    "DevplugError",
    "Health",
    "HealthPolicy",
    "HealthSettings",
    "HostPathError",
    "KubeletError",
    "Mount",
    "PluginOptions",
    "PluginSource",
    "Plugins",
    "RegistrationError",
    "ResourceStatus",
    "Runner",
    "Settings",
    "Version",
    "__version__",
    "install_signals",
    "load_settings",
    "run",
    "run_async",
    "serve",
]

# Where each public name lives: the same modules as the imports above, which type checkers read.
_HOMES = {
    "ResourceStatus": "devplug._device_plugin.resource",
    "PluginSource": "devplug._device_plugin.runner",
    "Plugins": "devplug._device_plugin.runner",
    "Runner": "devplug._device_plugin.runner",
    "serve": "devplug._main",
    "run": "devplug._main",
    "install_signals": "devplug._runtime.signals",
    "run_async": "devplug._runtime.signals",
    "HostPathError": "devplug.checks",
    "ConfigError": "devplug.errors",
    "DevplugError": "devplug.errors",
    "KubeletError": "devplug.errors",
    "RegistrationError": "devplug.errors",
    "HealthPolicy": "devplug.health",
    "HealthSettings": "devplug.health",
    "ContainerAllocation": "devplug.models",
    "Device": "devplug.models",
    "DeviceSpec": "devplug.models",
    "Health": "devplug.models",
    "Mount": "devplug.models",
    "PluginOptions": "devplug.models",
    "Version": "devplug.models",
    "DevicePlugin": "devplug.plugin",
    "Settings": "devplug.settings",
    "load_settings": "devplug.settings",
}

# DRA-only models that moved to devplug.dra: still given here, with a DeprecationWarning.
_MOVED = {"CounterConsumption": "devplug.dra", "CounterSet": "devplug.dra", "DeviceTaint": "devplug.dra"}
_HOMES.update(dict.fromkeys(_MOVED, "devplug.models"))


if not typing.TYPE_CHECKING:  # type checkers read the imports above; a misspelt name stays an error
    __getattr__, __dir__ = _lazy_names(__name__, _HOMES, __all__, moved=_MOVED)
