"""Kubernetes quantities (``resource.Quantity``) as exact numbers: pure functions, no I/O.

Shared by the models (what an author may write), the DRA runtime (a share's consumed capacity
against its device's) and the testing kit's allocator, so that all three read ``1Gi``, ``1024Mi``
and ``1073741824`` as the same amount.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, localcontext

__all__ = ["QUANTITY", "is_quantity", "quantity"]

# A decimal number and at most one suffix (binary SI, decimal SI or exponent).
QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def is_quantity(value: object) -> bool:
    """A quantity as JSON: a string in the quantity format, or a plain number."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, str) and QUANTITY.fullmatch(value) is not None


def quantity(value: object) -> Decimal:
    """A quantity (JSON string or number) as an exact number: ``1Gi`` == ``1024Mi``.

    Raises:
        ValueError: not a quantity.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Decimal(str(value))
    match = QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{value!r} is not a quantity")
    number, suffix = Decimal(match[1]), match[2] or ""
    with localcontext(Context(prec=200)):  # exact for every quantity the API server stores
        if suffix in _BINARY:
            return number * (1 << _BINARY[suffix])
        if len(suffix) > 1:  # an exponent: 1e3, 5E-2
            return number.scaleb(int(suffix[1:]))
        return number.scaleb(_DECIMAL.get(suffix, 0))
