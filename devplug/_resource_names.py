"""The kubelet's rule for extended resource names, as a pure function (no I/O).

The runner refuses a plugin whose name the kubelet would refuse (it would otherwise retry
Register forever), and the fake kubelet answers with the kubelet's own text for the same test.
"""

from __future__ import annotations

import re

_REQUESTS_PREFIX = "requests."
_NATIVE_NAMESPACE = "kubernetes.io/"
_QUALIFIED_NAME_MAX = 63
_QUALIFIED_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN_MAX = 253
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


def _is_qualified_name(value: str) -> bool:
    # The apimachinery rule: an optional DNS-1123 subdomain prefix and "/", then a name.
    parts = value.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > _DNS1123_SUBDOMAIN_MAX or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return False
    name = parts[-1]
    return 0 < len(name) <= _QUALIFIED_NAME_MAX and _QUALIFIED_NAME.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """Whether ``name`` is an extended resource name, by the kubelet's own test.

    It must not be a native resource (it contains ``/`` and not ``kubernetes.io/``), must not
    start with ``requests.``, and ``requests.`` + name must be a qualified name: the kubelet
    checks the name a resource quota would use for it.
    """
    if "/" not in name or _NATIVE_NAMESPACE in name or name.startswith(_REQUESTS_PREFIX):
        return False
    return _is_qualified_name(_REQUESTS_PREFIX + name)


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
