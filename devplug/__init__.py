"""devplug: Kubernetes device plugins in async Python.

Subclass :class:`DevicePlugin`, then ``devplug.run(MyPlugin())``: devplug serves it on a unix
socket, registers it with the kubelet, streams the device list and its health, answers
allocations, and registers again whenever the kubelet restarts.

Building blocks, each its own module: :mod:`devplug.policies` (preferred-allocation policies),
:mod:`devplug.topology` (NUMA nodes from sysfs), :mod:`devplug.cdi` (CDI spec files),
:mod:`devplug.health` (health policy) and :mod:`devplug.checks` (host-path checks).
"""

from __future__ import annotations

from devplug._core.resource import ResourceStatus
from devplug._core.runner import Plugins, PluginSource, Runner, serve
from devplug._main import run
from devplug.checks import HostPathError
from devplug.errors import ConfigError, DevplugError, KubeletError, RegistrationError
from devplug.health import HealthPolicy, HealthSettings
from devplug.models import ContainerAllocation, Device, DeviceSpec, Health, Mount, PluginOptions, Version
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
    "load_settings",
    "run",
    "serve",
]
