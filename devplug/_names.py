"""Kubernetes' name rules, as pure functions (no I/O): DNS labels and subdomains, qualified names
(label keys and values), and the kubelet's test for an extended resource name.

Every part of devplug that checks a name asks here: the settings (driver and node names), the
models (counter names, taint keys, attribute domains), the DRA runtime (device names) and the
runner and fake kubelet (resource names).
"""

from __future__ import annotations

import re

__all__ = [
    "LABEL_MAX",
    "QUALIFIED_NAME",
    "SUBDOMAIN_MAX",
    "is_dns_label",
    "is_dns_subdomain",
    "is_extended_resource_name",
    "is_qualified_name",
    "resource_name_problem",
]

_LABEL_FMT = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_LABEL = re.compile(_LABEL_FMT)
_SUBDOMAIN = re.compile(rf"{_LABEL_FMT}(?:\.{_LABEL_FMT})*")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253
QUALIFIED_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
"""A qualified name's name part, and a label value: letters, digits, '-', '_' and '.', with a
letter or digit at both ends."""
_QUALIFIED_NAME_MAX = 63
_REQUESTS_PREFIX = "requests."
_NATIVE_NAMESPACE = "kubernetes.io/"


def is_dns_label(name: str) -> bool:
    """Whether ``name`` is an RFC 1123 label (lowercase, at most 63 characters)."""
    return 0 < len(name) <= LABEL_MAX and _LABEL.fullmatch(name) is not None


def is_dns_subdomain(value: str, limit: int = SUBDOMAIN_MAX) -> bool:
    """Whether ``value`` is an RFC 1123 DNS subdomain of at most ``limit`` characters."""
    return 0 < len(value) <= limit and _SUBDOMAIN.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """The apimachinery rule: an optional DNS subdomain prefix and "/", then a name of at most 63."""
    parts = value.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2 and not is_dns_subdomain(parts[0]):
        return False
    name = parts[-1]
    return 0 < len(name) <= _QUALIFIED_NAME_MAX and QUALIFIED_NAME.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """Whether ``name`` is an extended resource name, by the kubelet's own test.

    It must not be a native resource (it contains ``/`` and not ``kubernetes.io/``), must not
    start with ``requests.``, and ``requests.`` + name must be a qualified name: the kubelet
    checks the name a resource quota would use for it.
    """
    if "/" not in name or _NATIVE_NAMESPACE in name or name.startswith(_REQUESTS_PREFIX):
        return False
    return is_qualified_name(_REQUESTS_PREFIX + name)


def resource_name_problem(name: object) -> str | None:
    """Why the kubelet would refuse ``name`` as a device plugin's resource name, or None."""
    if not isinstance(name, str) or not name:
        return "no resource_name (set it to an extended resource name such as example.com/widget)"
    if is_extended_resource_name(name):
        return None
    return (
        f"{name!r} is not an extended resource name: the kubelet wants DOMAIN/NAME, the domain a "
        "lowercase DNS subdomain outside kubernetes.io, the name at most 63 letters, digits, "
        "'-', '_' or '.' (e.g. example.com/widget)"
    )
