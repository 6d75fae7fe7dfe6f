"""Container Device Interface (CDI) specs: models, name rules, the version they need, files.

A device plugin can hand the container runtime fully qualified CDI names
(``vendor.com/class=name``) in :attr:`~devplug.ContainerAllocation.cdi_devices`; the runtime
then applies the edits of that device from a spec file in ``/var/run/cdi`` (dynamic specs) or
``/etc/cdi`` (static ones). Override :meth:`devplug.DevicePlugin.cdi_spec` and devplug writes the
spec for every device set, before the kubelet sees the devices.

The models use Python names; :meth:`CdiSpec.to_json` writes the spec's camelCase keys, leaves
out empty fields (a runtime refuses unknown ones), and sets ``cdiVersion`` to the lowest
version whose features the spec uses (a runtime refuses a spec that declares less).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from devplug._cdi_files import DEFAULT_CDI_DIR, remove_spec, spec_file_name, write_atomically

if TYPE_CHECKING:
    import os
    from pathlib import Path

__all__ = [
    "DEFAULT_CDI_DIR",
    "VERSIONS",
    "CdiDevice",
    "CdiMount",
    "CdiSpec",
    "ContainerEdits",
    "DeviceNode",
    "Hook",
    "IntelRdt",
    "NetDevice",
    "parse_qualified_name",
    "qualified_name",
    "remove_spec",
    "spec_file_name",
    "validate_device_name",
    "validate_kind",
    "write_spec",
]

VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
"""The cdiVersion values devplug writes or accepts, oldest first (runtimes accept >= 0.3.0)."""

# vendor: a letter first, a letter or digit last, letters, digits and _ - . between.
_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
# class: the same shape (dots need 0.6.0), at most 63 characters.
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
# device name: a letter or digit first and last (a leading digit needs 0.5.0), _ - . : between.
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def validate_kind(kind: str) -> tuple[str, str]:
    """Split ``vendor.com/class`` into vendor and class.

    Raises:
        ValueError: ``kind`` is not ``vendor/class`` or a part breaks the naming rules.
    """
    vendor, sep, klass = kind.partition("/")
    if not sep or not _VENDOR.match(vendor) or not _CLASS.match(klass):
        raise ValueError(
            f"invalid CDI kind {kind!r}: expected vendor/class (e.g. vendor.com/device), each part "
            "starting with a letter and ending with a letter or digit (class at most 63 characters)"
        )
    return vendor, klass


def validate_device_name(name: str) -> str:
    """Return ``name`` if it is a valid CDI device name.

    Raises:
        ValueError: it does not start and end with a letter or digit, or holds characters
            other than letters, digits and ``_ - . :``.
    """
    if not _DEVICE.match(name):
        raise ValueError(
            f"invalid CDI device name {name!r}: letters, digits and _ - . : only, "
            "starting and ending with a letter or digit"
        )
    return name


def qualified_name(kind: str, name: str) -> str:
    """The fully qualified device name ``vendor.com/class=name`` (validated).

    Raises:
        ValueError: the kind or the name is invalid.
    """
    validate_kind(kind)
    return f"{kind}={validate_device_name(name)}"


def parse_qualified_name(qualified: str) -> tuple[str, str, str]:
    """Split ``vendor.com/class=name`` into vendor, class and device name.

    Raises:
        ValueError: it is not fully qualified or a part is invalid.
    """
    kind, sep, name = qualified.partition("=")
    if not sep:
        raise ValueError(f"CDI device name {qualified!r} is not fully qualified (vendor.com/class=name)")
    vendor, klass = validate_kind(kind)
    return vendor, klass, validate_device_name(name)


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
    )


class DeviceNode(_Model):
    """A device node to create in the container."""

    path: str = Field(min_length=1)
    """Path of the node in the container."""
    host_path: str | None = None
    """Path on the host, when it differs from ``path`` (needs 0.5.0)."""
    type: Literal["b", "c", "u", "p"] | None = None
    """b: block, c / u: character (unbuffered), p: FIFO; default: as found on the host."""
    major: int | None = Field(default=None, ge=0)
    minor: int | None = Field(default=None, ge=0)
    file_mode: int | None = Field(default=None, ge=0)
    """Permission bits of the node, e.g. 0o666."""
    permissions: str | None = None
    """cgroup access: a combination of r, w, m."""
    uid: int | None = Field(default=None, ge=0)
    gid: int | None = Field(default=None, ge=0)

    @field_validator("permissions")
    @classmethod
    def _rwm(cls, value: str | None) -> str | None:
        if value is not None and (not value or set(value) - set("rwm") or len(set(value)) != len(value)):
            raise ValueError(f"permissions must be a combination of 'r', 'w', 'm', got {value!r}")
        return value


class CdiMount(_Model):
    """A mount to add to the container."""

    host_path: str = Field(min_length=1)
    container_path: str = Field(min_length=1)
    options: tuple[str, ...] = ()
    """Mount options, e.g. ("ro", "nosuid", "bind")."""
    type: str | None = None
    """Filesystem type, e.g. "bind" or "tmpfs" (needs 0.4.0)."""


class Hook(_Model):
    """An OCI hook to run at one point of the container's life."""

    hook_name: Literal[
        "prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"
    ]
    path: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = Field(default=None, ge=1)
    """Seconds the hook may run."""


class IntelRdt(_Model):
    """Intel RDT (cache and memory-bandwidth allocation) settings (needs 0.7.0)."""

    clos_id: str | None = Field(default=None, alias="closID")
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    schemata: tuple[str, ...] = ()
    """Needs 1.1.0."""
    enable_monitoring: bool = False
    """Needs 1.1.0."""


class NetDevice(_Model):
    """A host network interface moved into the container (needs 1.1.0)."""

    host_interface_name: str = Field(min_length=1)
    name: str = Field(min_length=1)
    """Its name inside the container."""


class ContainerEdits(_Model):
    """What the runtime changes in a container that gets the device (or any device of the spec)."""

    env: tuple[str, ...] = ()
    """``NAME=value`` entries."""
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[CdiMount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()
    """Extra group IDs for the container's process (needs 0.7.0)."""
    intel_rdt: IntelRdt | None = None
    net_devices: tuple[NetDevice, ...] = ()

    @field_validator("env")
    @classmethod
    def _assignments(cls, env: tuple[str, ...]) -> tuple[str, ...]:
        for entry in env:
            if not entry.partition("=")[0] or "=" not in entry:
                raise ValueError(f"env entry {entry!r} is not NAME=value")
        return env

    @field_validator("additional_gids")
    @classmethod
    def _gids(cls, gids: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 0 <= g < 2**32 for g in gids):
            raise ValueError("group IDs are unsigned 32-bit numbers")
        return gids


class CdiDevice(_Model):
    """One named device of a spec; its fully qualified name is ``<kind>=<name>``."""

    name: str
    annotations: dict[str, str] = Field(default_factory=dict)
    """Metadata for tools; not applied to the container (needs 0.6.0)."""
    container_edits: ContainerEdits = ContainerEdits()

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return validate_device_name(name)


class CdiSpec(_Model):
    """A CDI spec's content: the devices of one kind and what each does to a container.

    devplug renders it (:meth:`to_json`) and names its file (:attr:`file_name`). A DRA driver's
    ``prepare_claim`` that hands over a claim's spec hands over the file itself, a
    :class:`devplug.dra.CdiSpecFile` (a name and a text: ``text=spec.to_json()``, or YAML).

    Leave ``cdi_version`` unset to have the lowest version the content needs written; a version
    given explicitly must be known and at least that.
    """

    cdi_version: str | None = None
    kind: str
    """``vendor.com/class``; the file is named ``<vendor>-<class>.json``."""
    devices: tuple[CdiDevice, ...] = Field(min_length=1)
    container_edits: ContainerEdits = ContainerEdits()
    """Applied to a container when any device of this spec is used."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Metadata for tools (needs 0.6.0)."""

    @field_validator("kind")
    @classmethod
    def _kind(cls, kind: str) -> str:
        validate_kind(kind)
        return kind

    @model_validator(mode="after")
    def _consistent(self) -> CdiSpec:
        names = [d.name for d in self.devices]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate CDI device names: {', '.join(dupes)}")
        if self.cdi_version is not None:
            if self.cdi_version not in VERSIONS:
                raise ValueError(f"unknown cdiVersion {self.cdi_version!r} (known: {', '.join(VERSIONS)})")
            needed = self.required_version()
            if VERSIONS.index(self.cdi_version) < VERSIONS.index(needed):
                raise ValueError(f"cdiVersion {self.cdi_version} is too low for this spec: it needs {needed}")
        return self

    def qualified_name(self, device: str) -> str:
        """``<kind>=<device>``: the name to return in ``ContainerAllocation.cdi_devices``."""
        return f"{self.kind}={device}"

    def required_version(self) -> str:
        """The lowest cdiVersion whose features this spec uses."""
        edits = [self.container_edits, *(d.container_edits for d in self.devices)]
        rdt = [e.intel_rdt for e in edits if e.intel_rdt is not None]
        if any(e.net_devices for e in edits) or any(r.schemata or r.enable_monitoring for r in rdt):
            return "1.1.0"
        if rdt or any(e.additional_gids for e in edits):
            return "0.7.0"
        if self.annotations or any(d.annotations for d in self.devices) or "." in self.kind.partition("/")[2]:
            return "0.6.0"
        if any(d.name[0].isdigit() for d in self.devices) or any(
            n.host_path for e in edits for n in e.device_nodes
        ):
            return "0.5.0"
        if any(m.type for e in edits for m in e.mounts):
            return "0.4.0"
        return "0.3.0"

    def to_dict(self) -> dict[str, object]:
        """The spec as the JSON document runtimes read (camelCase keys, no empty fields)."""
        data = self.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True)
        data["cdiVersion"] = self.cdi_version or self.required_version()
        # Every device carries containerEdits, empty or not: the runtimes' schema requires it.
        for device in data["devices"]:
            device.setdefault("containerEdits", {})
        ordered = {"cdiVersion": data.pop("cdiVersion"), "kind": data.pop("kind")}
        return ordered | data

    def to_json(self) -> str:
        """The spec file's text: indented JSON with a final newline."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @property
    def file_name(self) -> str:
        """``<vendor>-<class>.json``."""
        return spec_file_name(self.kind)


def write_spec(spec: CdiSpec, directory: str | os.PathLike[str] = DEFAULT_CDI_DIR) -> Path:
    """Write ``spec`` atomically as ``<directory>/<vendor>-<class>.json`` (mode 0644).

    The directory is created if missing. Returns the file's path.

    Raises:
        OSError: the directory or the file could not be written (the old file, if any, stays).
    """
    return write_atomically(directory, spec.file_name, spec.to_json())
