"""The optional parts of devplug and the extras that install them.

``pip install devplug`` is what a device plugin needs. A part that needs more fails when it is
used, not when devplug is imported, with one line naming the extra to install:

* ``dra``: the Kubernetes API client of a DRA driver (lightkube and its models);
* ``testing``: the testing kit's fake API server (h11, and lightkube's models for its schema);
* ``metrics``: the Prometheus exposition (prometheus-client);
* ``nvidia``: NVIDIA's NVML bindings (nvidia-ml-py).
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtraError", "missing", "require", "require_dra"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "dra": ("lightkube", "lightkube.models"),
    "testing": ("h11", "lightkube.models"),
    "metrics": ("prometheus_client",),
    "nvidia": ("pynvml",),
}


class MissingExtraError(ImportError):
    """A part of devplug was used without its extra; the message is one line naming it."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} needs the {extra!r} extra: pip install 'devplug[{extra}]'")
        self.extra = extra


def missing(extra: str) -> str | None:
    """The first module of ``extra`` that cannot be imported here, or ``None``."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a missing parent package; a module set to None
            found = False
        if not found:
            return module
    return None


def require(extra: str, what: str) -> None:
    """Check that ``extra`` is installed before ``what`` is used.

    Raises:
        MissingExtraError: it is not (an ImportError: one line, naming the extra).
    """
    if missing(extra) is not None:
        raise MissingExtraError(what, extra)


def require_dra() -> None:
    """Check the ``dra`` extra before a process serves ``--api dra``.

    Raises:
        ConfigError: it is missing (one line naming the extra; the commands exit 2).
    """
    if missing("dra") is not None:
        from devplug.errors import ConfigError

        raise ConfigError(str(MissingExtraError("--api dra", "dra")))
