"""Names DRA needs: device names (DNS labels), the default driver name, CDI kinds and files."""

from __future__ import annotations

import hashlib
import re

from devplug._names import is_dns_label

_NOT_LABEL = re.compile(r"[^a-z0-9]+")

CDI_CLASS = "claim"
"""The CDI class of the per-claim specs (kind ``k8s.<driver>/claim``)."""


def device_name(device_id: str, prefix: str = "") -> str:
    """The ResourceSlice name of a device ID: stable, unique and a valid DNS label.

    An ID that is a DNS label already (``gpu-0``) is kept. Any other (``GPU-8a3c...``,
    ``fake_0``) is lowercased, runs of other characters become ``-``, and eight hex digits of
    the ID's SHA-256 are appended, so two IDs that read alike (``Fake_0``, ``fake-0``) never
    share a name, and a name never depends on which other devices exist. ``prefix`` (a label)
    keeps the devices of several resources of one driver apart.
    """
    base = f"{prefix}-{device_id}" if prefix else device_id
    if is_dns_label(base):
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    readable = _NOT_LABEL.sub("-", base.lower()).strip("-")[:54].strip("-")
    return f"{readable}-{digest}" if readable else f"device-{digest}"


def default_driver_name(resource_name: str) -> str:
    """``example.com/gpu`` → ``gpu.example.com``: the resource's name under its vendor's domain."""
    vendor, _, name = resource_name.partition("/")
    label = _NOT_LABEL.sub("-", name.lower()).strip("-")
    return f"{label}.{vendor}" if label else vendor


def resource_prefix(resource_name: str) -> str:
    """A DNS label for a resource (``example.com/gpu`` → ``gpu``), to prefix its device names."""
    name = resource_name.rpartition("/")[2]
    return _NOT_LABEL.sub("-", name.lower()).strip("-")[:20].strip("-") or "device"


def cdi_kind(driver: str) -> str:
    """The CDI kind of a driver's claim specs: ``k8s.<driver>/claim``."""
    return f"k8s.{driver}/{CDI_CLASS}"


def claim_spec_file(driver: str, claim_uid: str) -> str:
    """``k8s.<driver>-claim_<uid>.json``: one transient spec per prepared claim."""
    return f"k8s.{driver}-{CDI_CLASS}_{claim_uid}.json"


def cdi_device(claim_uid: str, request: str) -> str:
    """The CDI device name for one request of a claim: ``<uid>-<request>``."""
    return f"{claim_uid}-{_NOT_LABEL.sub('-', request.lower()).strip('-') or 'request'}"
