"""Time-slicing and MPS: discovery's resources → the resources served, with replica counts.

Pure: records and the ``sharing`` config in, :class:`SharedResource` out.

As upstream (``internal/rm/device_map.go``): each ``sharing.*.resources`` entry picks devices of
the discovered resource ``name`` (``all``, the first N, or a list of indexes / UUIDs); those
are advertised as ``replicas`` replicas ``<id>::<n>`` under the entry's resource name, the
others stay under ``name`` unshared. The name of the replicas is, beyond upstream (which resets
them, NVIDIA issue 1786), the entry's ``rename`` when set, else ``<name>.shared`` with
``renameByDefault``, else ``name``; and ``devices`` subsets are honoured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import structlog

from devplug.errors import ConfigError
from devplug_nvidia._config._file import is_gpu_uuid, is_mig_uuid

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug_nvidia._config._file import ReplicaResource, Sharing
    from devplug_nvidia._gpu._model import GpuRecord

__all__ = ["REPLICA_SEPARATOR", "SharedResource", "apply_sharing", "replica_id", "shared_name"]

log = structlog.get_logger("devplug_nvidia.sharing")

REPLICA_SEPARATOR = "::"

Strategy = Literal["none", "time-slicing", "mps"]


def replica_id(device_id: str, n: int) -> str:
    """``GPU-x`` and 2 → ``GPU-x::2``."""
    return f"{device_id}{REPLICA_SEPARATOR}{n}"


def shared_name(name: str) -> str:
    """The ``renameByDefault`` name: ``nvidia.com/gpu`` → ``nvidia.com/gpu.shared``."""
    return f"{name}.shared"


@dataclass(frozen=True)
class SharedResource:
    """One resource as served: its records and how many replicas each is listed as."""

    name: str
    records: tuple[GpuRecord, ...]
    replicas: Mapping[str, int] = field(default_factory=dict)
    """Record UUID → replicas; a record not here is listed once, as itself."""
    strategy: Strategy = "none"
    """The node's sharing strategy (what MPS checks and mounts follow)."""
    fail_requests_greater_than_one: bool = False
    """Reject a container request for more than one replica."""

    def replicas_of(self, record: GpuRecord) -> int:
        """How many replicas ``record`` is listed as (1: not shared)."""
        return self.replicas.get(record.uuid, 1)

    @property
    def shared(self) -> bool:
        """Some of its devices are replicated."""
        return any(n > 1 for n in self.replicas.values())


def apply_sharing(
    by_resource: Mapping[str, Sequence[GpuRecord]], sharing: Sharing
) -> dict[str, SharedResource]:
    """The resources to serve, by name, for discovery's ``by_resource`` and ``sharing``.

    Raises:
        ConfigError: a ``devices`` entry names no device of the resource, asks for more devices
            than there are, or picks a device another entry already shares; MPS on MIG devices.
    """
    section = sharing.section
    strategy: Strategy = sharing.strategy
    fail = sharing.fail_requests_greater_than_one
    if section is None:
        return {name: SharedResource(name, tuple(rs)) for name, rs in by_resource.items() if rs}

    where = "sharing.mps" if strategy == "mps" else "sharing.timeSlicing"
    claimed: dict[str, str] = {}  # record UUID → the entry that replicates it
    replicated: dict[str, list[tuple[GpuRecord, int]]] = {}
    for i, entry in enumerate(section.resources):
        label = f"{where}.resources[{i}] ({entry.name})"
        records: list[GpuRecord] = list(by_resource.get(entry.name, ()))
        if not records:
            log.warning(
                "sharing_resource_not_found",
                resource=entry.name,
                entry=label,
                found=sorted(by_resource),
                note="nothing on this node is shared by this entry",
            )
            continue
        for record in _pick(entry, records, label):
            if record.uuid in claimed:
                raise ConfigError(
                    f"{label}: device {record.uuid} is already shared by {claimed[record.uuid]}"
                )
            if strategy == "mps" and record.kind == "mig":
                raise ConfigError(
                    f"{label}: sharing using MPS is not supported for MIG devices ({record.uuid})"
                )
            claimed[record.uuid] = label
            target = entry.rename or (shared_name(entry.name) if section.rename_by_default else entry.name)
            replicated.setdefault(target, []).append((record, entry.replicas))

    served: dict[str, tuple[list[GpuRecord], dict[str, int]]] = {}
    for name, found in by_resource.items():
        rest = [r for r in found if r.uuid not in claimed]
        if rest:
            served[name] = (rest, {})
    for name, picked in replicated.items():
        records_of, counts = served.setdefault(name, ([], {}))
        for record, count in picked:
            records_of.append(record)
            counts[record.uuid] = count
    resources = {}
    for name, (records_of, counts) in served.items():
        resources[name] = SharedResource(
            name,
            tuple(records_of),
            counts,
            strategy=strategy,
            fail_requests_greater_than_one=fail,
        )
        if counts and len(counts) != len(records_of):
            log.warning(
                "sharing_mixed_resource",
                resource=name,
                shared=len(counts),
                unshared=len(records_of) - len(counts),
                note="replicas and whole devices under one name; set rename to tell them apart",
            )
    return resources


def _pick(entry: ReplicaResource, records: list[GpuRecord], label: str) -> list[GpuRecord]:
    """The records an entry's ``devices`` selects, in the order it names them."""
    devices = entry.devices
    if devices == "all":
        return records
    if isinstance(devices, int):
        if devices > len(records):
            raise ConfigError(
                f"{label}: requested {devices} devices to be replicated, but only {len(records)} "
                "devices available"
            )
        return records[:devices]
    picked: list[GpuRecord] = []
    for ref in devices:
        record = _find(ref, records)
        if record is None:
            kind = "with UUID" if is_gpu_uuid(ref) or is_mig_uuid(ref) else "at index"
            indexes = ", ".join(r.index for r in records)
            raise ConfigError(
                f"{label}: no matching device {kind}: {ref} (the resource has indexes {indexes})"
            )
        if record not in picked:
            picked.append(record)
    return picked


def _find(ref: str, records: list[GpuRecord]) -> GpuRecord | None:
    for record in records:
        if ref in (record.uuid, record.index):
            return record
        # The older MIG UUID form names the parent GPU and the GI / CI IDs.
        mig = record.mig
        if mig is not None and ref == (
            f"MIG-{mig.parent_uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}"
        ):
            return record
    return None
