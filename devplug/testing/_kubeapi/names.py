"""Name and value formats of Kubernetes objects, with ``k8s.io/apimachinery/pkg/util/validation``'s texts.

Each ``is_*`` function returns the list of messages the Go function of the same name returns
(empty when the value is fine); callers wrap them into field errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_UP, Context, Decimal, localcontext

from devplug._quantity import QUANTITY, quantity
from devplug.testing._kubeapi.status import FieldError, invalid, too_long, type_invalid

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
C_IDENTIFIER_MAX = 32  # resource.k8s.io DeviceMaxIDLength
DOMAIN_MAX = 63  # resource.k8s.io DriverNameMaxLength

_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + r"(\." + _LABEL_FMT + ")*"
_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QNAME_FMT + ")?"
_C_IDENTIFIER_FMT = "[A-Za-z_][A-Za-z0-9_]*"

_LABEL_RE = re.compile(_LABEL_FMT, re.ASCII)
_SUBDOMAIN_RE = re.compile(_SUBDOMAIN_FMT, re.ASCII)
_QNAME_RE = re.compile(_QNAME_FMT, re.ASCII)
_LABEL_VALUE_RE = re.compile(_LABEL_VALUE_FMT, re.ASCII)
_C_IDENTIFIER_RE = re.compile(_C_IDENTIFIER_FMT, re.ASCII)

# semver.org 2.0.0, as resource.k8s.io validates attribute versions.
_NUM = "(0|[1-9][0-9]*)"
_PRE_ID = "(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
_SEMVER_RE = re.compile(
    rf"{_NUM}\.{_NUM}\.{_NUM}(-{_PRE_ID}(\.{_PRE_ID})*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?", re.ASCII
)

# resource.Quantity: a decimal number and one suffix (binary SI, decimal SI or an exponent).
QUANTITY_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
INT64_MAX = 2**63 - 1

_NANO = Decimal("1e-9")
_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    # Go's validation.RegexError, double spaces included.
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len(limit: int) -> str:
    return f"must be no more than {limit} characters"


_LABEL_MSG = _regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    _LABEL_FMT,
    "my-name",
    "123-abc",
)
_SUBDOMAIN_MSG = _regex_error(
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character",
    _SUBDOMAIN_FMT,
    "example.com",
)
_QNAME_MSG = _regex_error(
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character",
    _QNAME_FMT,
    "MyName",
    "my.name",
    "123-abc",
)
_LABEL_VALUE_MSG = _regex_error(
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character",
    _LABEL_VALUE_FMT,
    "MyValue",
    "my_value",
    "12345",
)
_C_IDENTIFIER_MSG = _regex_error(
    "a valid C identifier must start with alphabetic character or '_', followed by a string of "
    "alphanumeric characters or '_'",
    _C_IDENTIFIER_FMT,
    "my_name",
    "MY_NAME",
    "MyName",
)


def is_dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_LABEL_MAX:
        errors.append(_max_len(DNS1123_LABEL_MAX))
    if not _LABEL_RE.fullmatch(value):
        errors.append("must not contain dots" if _SUBDOMAIN_RE.fullmatch(value) else _LABEL_MSG)
    return errors


def is_dns1123_subdomain(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errors.append(_max_len(DNS1123_SUBDOMAIN_MAX))
    if not _SUBDOMAIN_RE.fullmatch(value):
        errors.append(_SUBDOMAIN_MSG)
    return errors


def is_qualified_name(value: str) -> list[str]:
    """A label key or taint key: ``[prefix/]name``, the prefix a DNS subdomain."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        suffix = "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        return [f"a valid label key {_QNAME_MSG} {suffix}"]  # 1.37's words, for any qualified name
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + m for m in is_dns1123_subdomain(parts[0]))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errors.append("name part " + _max_len(QUALIFIED_NAME_MAX))
    if not _QNAME_RE.fullmatch(name):
        errors.append("name part " + _QNAME_MSG)
    return errors


def is_label_value(value: str) -> list[str]:
    errors = []
    if len(value) > LABEL_VALUE_MAX:
        errors.append(_max_len(LABEL_VALUE_MAX))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def is_c_identifier(value: str) -> list[str]:
    return [] if _C_IDENTIFIER_RE.fullmatch(value) else [_C_IDENTIFIER_MSG]


def is_semver(value: str) -> bool:
    return _SEMVER_RE.fullmatch(value) is not None


# -- the field-error forms resource.k8s.io validation builds from them --------------------------


def driver_name(value: str, path: str) -> list[FieldError]:
    """validateDriverName: a DNS subdomain of at most 63 bytes (checked in lower case)."""
    if not value:
        return [FieldError("Required", path)]
    errors = [too_long(path, DOMAIN_MAX)] if len(value) > DOMAIN_MAX else []
    errors.extend(invalid(path, value, m) for m in is_dns1123_subdomain(value.lower()))
    return errors


def c_identifier(value: str, path: str) -> list[FieldError]:
    errors = [too_long(path, C_IDENTIFIER_MAX)] if len(value) > C_IDENTIFIER_MAX else []
    errors.extend(type_invalid(path, value, m) for m in is_c_identifier(value))
    return errors


def qualified_attribute_name(value: str, path: str) -> list[FieldError]:
    """validateQualifiedName: a C identifier, optionally prefixed by a domain and ``/``."""
    if not value:
        return [FieldError("Required", path, detail="name required")]
    parts = value.split("/")
    if len(parts) == 1:
        return c_identifier(parts[0], path)
    if len(parts) > 2:  # accepted, as the API server does (upstream knows; a TODO there)
        return []
    errors: list[FieldError] = []
    if not parts[0]:
        errors.append(FieldError("Required", path, detail="the domain must not be empty"))
    else:
        errors.extend(driver_name(parts[0], path))
    if not parts[1]:
        errors.append(FieldError("Required", path, detail="the name must not be empty"))
    else:
        errors.extend(c_identifier(parts[1], path))
    return errors


def dns_label(value: str, path: str) -> list[FieldError]:
    # corevalidation.ValidateDNS1123Label: an empty name is an invalid one, not a missing one.
    return [invalid(path, value, m) for m in is_dns1123_label(value)]


def dns_subdomain(value: str, path: str) -> list[FieldError]:
    return [invalid(path, value, m) for m in is_dns1123_subdomain(value)]


# -- resource.Quantity: a value and the format its text chose ------------------------------------


@dataclass(frozen=True)
class Quantity:
    """A ``resource.Quantity``: its exact value and its format (``DecimalSI``, ``BinarySI`` or
    ``DecimalExponent``, as the suffix it was written with says); ``str()`` is the canonical text
    the API server writes (``String()``: ``1024Mi`` is ``1Gi``, ``1000`` is ``1k``, ``0.5`` is
    ``500m``). Compare quantities by ``value``."""

    value: Decimal
    format: str = "DecimalSI"

    @classmethod
    def parse(cls, raw: object) -> Quantity:
        """A quantity as JSON (string or number), rounded up to a nano as ``ParseQuantity`` does.

        Raises:
            ValueError: not a quantity.
        """
        value = quantity(raw)
        exponent = value.as_tuple().exponent
        if isinstance(exponent, int) and exponent < -9:
            with localcontext(Context(prec=200)):
                value = value.quantize(_NANO, rounding=ROUND_UP)
        suffix = ""
        if isinstance(raw, str):
            match = QUANTITY.fullmatch(raw)
            suffix = (match[2] if match else None) or ""
        if suffix.endswith("i"):
            return cls(value, "BinarySI")
        if len(suffix) > 1:  # an exponent: 1e3, 5E-2
            return cls(value, "DecimalExponent")
        return cls(value, "DecimalSI")

    def __str__(self) -> str:
        return canonical_quantity(self.value, self.format)

    def int_value(self) -> int:
        """``Value()``: the value rounded away from zero to an integer."""
        with localcontext(Context(prec=200)):
            return int(self.value.to_integral_value(rounding=ROUND_UP))

    def milli_value(self) -> int:
        """``MilliValue()``: the value in thousandths, rounded away from zero."""
        with localcontext(Context(prec=200)):
            return int((self.value * 1000).to_integral_value(rounding=ROUND_UP))

    def milli_exact(self) -> bool:
        """Whether ``MilliValue()`` holds the value without loss (and within an int64)."""
        with localcontext(Context(prec=200)):
            milli = self.value * 1000
            return milli == milli.to_integral_value() and abs(milli) <= INT64_MAX

    def is_fractional(self) -> bool:
        return self.value != self.value.to_integral_value()


def canonical_quantity(value: Decimal, fmt: str = "DecimalSI") -> str:
    """The text ``resource.Quantity`` writes for ``value`` in format ``fmt`` (CanonicalizeBytes).

    Zero is ``0``. BinarySI stays binary only for whole numbers of at least 1024 in magnitude
    (``1536Mi``, ``1Gi``), otherwise it is written as DecimalSI. Decimal formats move every factor
    of ten into an exponent that is a multiple of three: an SI suffix for DecimalSI (``1500``,
    ``15k``, ``500m``, ``1500m``), ``e<n>`` for DecimalExponent (``1e3``).
    """
    if value == 0:
        return "0"
    with localcontext(Context(prec=200)):  # exact for every quantity, as in _quantity
        sign = "-" if value < 0 else ""
        value = abs(value)
        if fmt == "BinarySI" and value >= 1024 and value == value.to_integral_value():
            number, power = int(value), 0
            while number % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
                number, power = number // 1024, power + 1
            return f"{sign}{number}{_BINARY_SUFFIXES[power]}"
        _, digits, exponent = value.normalize().as_tuple()
    mantissa = int("".join(map(str, digits)))
    exp = int(exponent)
    while exp % 3:
        mantissa, exp = mantissa * 10, exp - 1
    if fmt == "DecimalExponent":
        return f"{sign}{mantissa}{f'e{exp}' if exp else ''}"
    if exp in _DECIMAL_SUFFIXES:
        return f"{sign}{mantissa}{_DECIMAL_SUFFIXES[exp]}"
    return f"{sign}{mantissa}e{exp}"  # beyond E (past an int64): no SI suffix
