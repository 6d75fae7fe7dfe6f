"""The installed distribution's version, as ``--version`` prints it and the start events log it."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

__all__ = ["version"]


@cache  # found by reading the distribution's metadata (~2 ms); asked for several times per start
def version() -> str:
    """The version of the installed ``devplug`` distribution (``unknown`` when run uninstalled)."""
    try:
        return _distribution_version("devplug")
    except PackageNotFoundError:
        return "unknown"
