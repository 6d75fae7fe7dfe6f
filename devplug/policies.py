"""Preferred-allocation policies: pure functions of (available, must-include, size).

Every policy returns exactly ``size`` IDs (or all available ones when fewer exist), keeps every
must-include ID, draws only from the available set, and is deterministic. :func:`repair` turns
any answer into one that keeps those rules, so a policy bug never reaches the kubelet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["first_available", "repair"]


def first_available(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The must-include IDs, then the available ones in the kubelet's order, up to ``size``."""
    return repair((), available, must_include, size)


def repair(
    choice: Iterable[str], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """Make ``choice`` valid: must-include first, then chosen IDs that are available, then fill.

    IDs not in ``available`` and duplicates are dropped; the result is cut or filled (in
    ``available`` order) to ``size``. Must-include IDs are kept even past ``size`` because the
    kubelet asked for them.
    """
    allowed = dict.fromkeys(available)
    result = dict.fromkeys(m for m in must_include if m in allowed)
    for source in (choice, available):
        for device_id in source:
            if len(result) >= size:
                return list(result)
            if device_id in allowed:
                result.setdefault(device_id)
    return list(result)
