"""The data a plugin author handles: devices, their health, and what a container gets.

Pure data: pydantic models with no I/O and no protobuf. The servicer converts these to and
from the wire types; nothing else in devplug touches protobuf.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ContainerAllocation", "Device", "DeviceSpec", "Health", "Mount", "PluginOptions"]


class Health(str, enum.Enum):
    """Device health as the kubelet reads it: only ``"Healthy"`` counts as allocatable."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"

    def __str__(self) -> str:
        return self.value


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Device(_Frozen):
    """One schedulable unit of a resource, as listed to the kubelet.

    ``numa_node=N`` is accepted as a shorthand for ``numa_nodes=(N,)``; ``None`` or an
    empty tuple means no NUMA affinity (the kubelet treats both the same).
    """

    id: str = Field(min_length=1)
    """The device ID the kubelet schedules and later passes back to ``allocate``."""
    health: Health = Health.HEALTHY
    """Whether the kubelet may hand this device to new containers."""
    numa_nodes: tuple[int, ...] = ()
    """The host NUMA nodes the device is attached to; empty for no topology."""

    @model_validator(mode="before")
    @classmethod
    def _numa_node_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "numa_node" in data:
            data = dict(data)
            node = data.pop("numa_node")
            if "numa_nodes" in data:
                raise ValueError("give numa_node or numa_nodes, not both")
            data["numa_nodes"] = () if node is None or node < 0 else (node,)
        return data

    @field_validator("numa_nodes")
    @classmethod
    def _non_negative(cls, nodes: tuple[int, ...]) -> tuple[int, ...]:
        if any(n < 0 for n in nodes):
            raise ValueError("NUMA node IDs are non-negative host node numbers")
        return nodes

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    def with_health(self, health: Health) -> Device:
        """A copy of this device with another health."""
        return self.model_copy(update={"health": health})


class DeviceSpec(_Frozen):
    """A device node to create in the container (``ContainerAllocateResponse.devices``)."""

    container_path: str
    """Path of the node inside the container."""
    host_path: str
    """Path of the node on the host."""
    permissions: str = "rw"
    """cgroup permissions: any of ``r`` (read), ``w`` (write), ``m`` (mknod)."""

    @field_validator("permissions")
    @classmethod
    def _permissions(cls, value: str) -> str:
        if not value or set(value) - set("rwm") or len(set(value)) != len(value):
            raise ValueError(f"permissions must be a combination of 'r', 'w', 'm', got {value!r}")
        return value

    @classmethod
    def rw(cls, host_path: str, container_path: str | None = None) -> DeviceSpec:
        """The same node at the same path (or ``container_path``), read-write."""
        return cls(host_path=host_path, container_path=container_path or host_path, permissions="rw")


class Mount(_Frozen):
    """A host path bind-mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool = False


class ContainerAllocation(_Frozen):
    """What one container gets for the devices it was given (one ``ContainerAllocateResponse``).

    The kubelet checkpoints this and replays it on container restarts without calling
    ``allocate`` again: put no one-time secrets here.
    """

    envs: dict[str, str] = Field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = Field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names (``vendor.com/class=name``)."""

    @field_validator("cdi_devices")
    @classmethod
    def _qualified(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            kind, sep, device = name.partition("=")
            if not sep or "/" not in kind or not device:
                raise ValueError(f"CDI device name {name!r} is not fully qualified (vendor.com/class=name)")
        return names


class PluginOptions(_Frozen):
    """The options advertised to the kubelet, derived from which hooks a plugin overrides."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False
