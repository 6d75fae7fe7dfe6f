"""devplug_nvidia: NVIDIA GPUs for Kubernetes, a drop-in for NVIDIA's device plugin.

Same flags, environment variables and config file as NVIDIA's Go plugin
(:mod:`devplug_nvidia.config`), same Allocate responses, served through :func:`devplug.run`.
"""

from __future__ import annotations

from devplug_nvidia._cli import main
from devplug_nvidia.config import NvidiaSettings, load_nvidia_settings

__all__ = ["NvidiaSettings", "load_nvidia_settings", "main"]
