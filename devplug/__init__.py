"""devplug: Kubernetes device plugins in async Python.

Subclass :class:`DevicePlugin`, then ``devplug.run(MyPlugin())``: devplug serves it on a unix
socket, registers it with the kubelet, streams the device list and its health, answers
allocations, and registers again whenever the kubelet restarts.
"""

from __future__ import annotations

from devplug._core.resource import ResourceStatus
from devplug._core.runner import PluginSource, Runner, run, serve
from devplug.errors import ConfigError, DevplugError, KubeletError, RegistrationError
from devplug.models import ContainerAllocation, Device, DeviceSpec, Health, Mount, PluginOptions
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
    "KubeletError",
    "Mount",
    "PluginOptions",
    "PluginSource",
    "RegistrationError",
    "ResourceStatus",
    "Runner",
    "Settings",
    "__version__",
    "load_settings",
    "run",
    "serve",
]
