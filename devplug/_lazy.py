"""Public names imported on first use (PEP 562), for the packages' ``__init__`` modules.

``import devplug`` (and the console scripts' packages) then load none of pydantic, structlog
or grpc; a name's module is imported the first time the name is asked for, and the name is
kept in the package's namespace so later lookups are plain attribute reads.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_names"]


def lazy_names(
    package: str,
    homes: Mapping[str, str],
    public: Iterable[str],
    extras: Mapping[str, str] | None = None,
    moved: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names live in ``homes`` (name → module).

    A name in ``extras`` (name → extra) needs that extra installed: without it, asking for the
    name raises :class:`devplug._extras.MissingExtraError` (an ImportError) naming the extra.
    A name in ``moved`` (name → the module to import it from now) is still given, with a
    DeprecationWarning every time, and never kept in the package's namespace or listed by ``dir``.
    """
    names = frozenset(public)
    needs = extras or {}
    elsewhere = moved or {}

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name in needs:
            from devplug._extras import require

            require(needs[name], f"{package}.{name}")
        value: object = getattr(importlib.import_module(home), name)
        if name in elsewhere:
            warnings.warn(
                f"{package}.{name} is deprecated: import it from {elsewhere[name]}",
                DeprecationWarning,
                stacklevel=2,
            )
            return value
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
