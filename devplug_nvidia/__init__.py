"""devplug_nvidia: NVIDIA GPUs for Kubernetes, a drop-in for NVIDIA's device plugin.

Same flags, environment variables and config file as NVIDIA's Go plugin
(:mod:`devplug_nvidia.config`), same Allocate responses, served through :func:`devplug.run`.
"""

from __future__ import annotations

import typing

from devplug._lazy import lazy_names as _lazy_names

if typing.TYPE_CHECKING:
    from devplug_nvidia.config import NvidiaSettings, load_nvidia_settings

__all__ = ["NvidiaSettings", "load_nvidia_settings", "main"]

# Imported on first use, so that ``devplug-nvidia`` starts by importing this package alone
# and loads the framework, pydantic and NVML inside main().
_HOMES = {
    "NvidiaSettings": "devplug_nvidia.config",
    "load_nvidia_settings": "devplug_nvidia.config",
}

if not typing.TYPE_CHECKING:  # type checkers read the imports above; a misspelt name stays an error
    __getattr__, __dir__ = _lazy_names(__name__, _HOMES, __all__)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``devplug-nvidia``: run the plugin (or ``labels``, or ``fake-root``).

    Returns the exit status (2: bad configuration, 1: init failure).
    """
    from devplug import install_signals

    install_signals("devplug-nvidia")  # first: a SIGTERM / Ctrl-C from here on never ends in a traceback
    from devplug_nvidia._cli._main import main as serve_gpus

    return serve_gpus(argv)
