"""Public names imported on first use (PEP 562), for the packages' ``__init__`` modules.

``import devplug`` (and the console scripts' packages) then load none of pydantic, structlog
or grpc; a name's module is imported the first time the name is asked for, and the name is
kept in the package's namespace so later lookups are plain attribute reads.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_names"]


def lazy_names(
    package: str,
    homes: Mapping[str, str],
    public: Iterable[str],
    extras: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names live in ``homes`` (name → module).

    A name in ``extras`` (name → extra) needs that extra installed: without it, asking for the
    name raises :class:`devplug._extras.MissingExtraError` (an ImportError) naming the extra.
    """
    names = frozenset(public)
    needs = extras or {}

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name in needs:
            from devplug._extras import require

            require(needs[name], f"{package}.{name}")
        value: object = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
