"""The fake backend's options and scenario file (pydantic: a wrong key or value is an error)."""

# No ``from __future__ import annotations`` here: pydantic would compile every field's annotation
# string when each class is made, milliseconds of every start (see bench/startup.py).

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from devplug import Device, HealthSettings, Settings

__all__ = ["DeviceChange", "FakeResource", "FakeSettings", "Faults", "HealthFlap", "Policy", "StateFile"]

Policy = Literal["first", "packed", "spread", "numa"]
"""Preferred-allocation policies of the fake: devplug.policies, grouped by NUMA node."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HealthFlap(_Strict):
    """One device going Unhealthy for ``down_for`` seconds every ``every`` seconds."""

    device: str
    """The device ID that flaps."""
    every: float = Field(gt=0)
    """Seconds between the starts of two unhealthy spells."""
    down_for: float = Field(gt=0)
    """Seconds each unhealthy spell lasts (less than ``every``)."""
    first_at: float = Field(default=0.0, ge=0)
    """Seconds after start of the first unhealthy spell."""

    @model_validator(mode="after")
    def _shorter_than_period(self) -> "HealthFlap":
        if self.down_for >= self.every:
            raise ValueError("down_for must be shorter than every")
        return self


class DeviceChange(_Strict):
    """Devices that appear or disappear ``at`` seconds after start."""

    at: float = Field(ge=0)
    add: tuple[Device, ...] = ()
    remove: tuple[str, ...] = ()


class Faults(_Strict):
    """Misbehaviour to inject, for testing how a cluster copes."""

    allocate_latency: float = Field(default=0.0, ge=0)
    """Seconds every Allocate takes before it answers."""
    allocate_error_probability: float = Field(default=0.0, ge=0, le=1)
    """Chance that an Allocate fails."""
    allocate_error_every: int | None = Field(default=None, ge=1)
    """Every n-th Allocate fails."""
    health_flaps: tuple[HealthFlap, ...] = ()
    timeline: tuple[DeviceChange, ...] = ()
    seed: int = 0
    """Seed of the random choices, so a scenario replays the same way."""


class FakeResource(_Strict):
    """One fake resource: generated devices (or a live state file) and its faults."""

    name: str = "example.com/fake"
    """The extended resource name."""
    count: int = Field(default=4, ge=0)
    """Devices fake-0 ... fake-<count-1>."""
    numa_nodes: int = Field(default=0, ge=0)
    """Device i sits on NUMA node i mod numa_nodes; 0 for no topology."""
    shares: int = Field(default=0, ge=0)
    """DRA: publish each generated device as shared by up to this many claims at once (a
    capacity ``shares`` of this value, a claim taking 1 unless it asks for more); 0: unshared."""
    device_specs: bool = False
    """Allocate adds /dev/null as /dev/<id> for each device."""
    cdi: bool = False
    """Allocate adds the CDI device names <name>=<id>, and their CDI spec is written to cdi_dir."""
    state_file: Path | None = None
    """JSON or YAML {"devices": [...]}: replaces the generated devices, re-read on every change."""
    policy: Policy | None = None
    """Offer preferred allocation with this policy (packed and spread group by NUMA node)."""
    health: HealthSettings | None = None
    """A health policy between the state file's health values and the kubelet; unset: as written."""
    faults: Faults = Faults()


class StateFile(_Strict):
    """The contents of a state file."""

    devices: tuple[Device, ...]


class FakeSettings(Settings):
    """devplug-fake: fake devices served to the kubelet, for demos, CI and scheduling tests."""

    resource: str = "example.com/fake"
    """The extended resource name."""
    count: int = Field(default=4, ge=0)
    """Number of devices (fake-0 ... fake-<count-1>)."""
    numa_nodes: int = Field(default=0, ge=0)
    """Device i sits on NUMA node i mod numa_nodes; 0 for no topology."""
    shares: int = Field(default=0, ge=0)
    """DRA: each device is shared by up to N claims (capacity shares: N, a claim takes 1 unless it
    asks for more); 0: each device goes to one claim."""
    device_specs: bool = False
    """Allocate adds /dev/null as /dev/<id> for each device."""
    cdi: bool = False
    """Allocate adds the CDI device names <resource>=<id>; their CDI spec is written to --cdi-dir."""
    state_file: Path | None = None
    """JSON or YAML {"devices": [...]} replacing the generated devices; re-read on every change."""
    policy: Policy | None = None
    """Offer preferred allocation: first, packed / spread (by NUMA node) or numa (fewest nodes)."""
    health_policy: bool = False
    """Pass the state file's health values through the health policy (the health.* settings)."""
    resources: tuple[FakeResource, ...] = ()
    """Config file only: several resources with fault injection (overrides the options above)."""

    def resource_configs(self) -> tuple[FakeResource, ...]:
        """The resources to serve: the scenario's, or the one the flags describe."""
        if self.resources:
            return self.resources
        return (
            FakeResource(
                name=self.resource,
                count=self.count,
                numa_nodes=self.numa_nodes,
                shares=self.shares,
                device_specs=self.device_specs,
                cdi=self.cdi,
                state_file=self.state_file,
                policy=self.policy,
                health=self.health if self.health_policy else None,
            ),
        )
