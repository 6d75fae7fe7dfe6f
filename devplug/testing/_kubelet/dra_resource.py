"""What the fake kubelet records about DRA drivers: registration attempts, instances, answers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import anyio

from devplug.models import ClaimRef

if TYPE_CHECKING:
    import grpc

ClaimLike = ClaimRef | tuple[str, str, str]
"""A claim in a request: a :class:`~devplug.models.ClaimRef`, or a plain ``(namespace, name, uid)``."""

HealthName = Literal["Healthy", "Unhealthy", "Unknown"]


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a NodePrepareResources answer, as the driver sent it."""

    request_names: tuple[str, ...]
    """The claim's requests it serves (empty: all of them)."""
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    """Set only on v1 when the driver sent one."""


@dataclass(frozen=True)
class ClaimResult:
    """A driver's answer for one claim: its devices, or its error (NodeUnprepareResources: error only)."""

    devices: tuple[ClaimDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class HealthReport:
    """One device of a NodeWatchResources message, as the driver sent it."""

    pool: str
    device: str
    health: HealthName
    last_updated: int = 0
    """The driver's own time stamp (unix seconds); the kubelet uses the time of receipt instead."""
    timeout_seconds: int = 0
    """``health_check_timeout_seconds``: 0 (or less) means the kubelet's 30 s."""
    message: str = ""


@dataclass(frozen=True)
class DraRegistration:
    """One registration attempt of a DRA plugin through the plugin watcher, accepted or not.

    ``driver`` and ``endpoint`` are empty when the attempt failed before GetInfo answered
    (the plugin's type was then unknown: such failures are recorded for device plugins too).
    ``endpoint`` is ``PluginInfo.endpoint``, or the registration socket when that is empty.
    ``service`` is the DRAPlugin service the kubelet chose. ``error`` is the kubelet's text,
    as sent with NotifyRegistrationStatus (or why that call failed: a kubelet stopped while
    sending it has registered the plugin all the same, and says ``context canceled``). ``at``
    is ``time.monotonic()`` of the outcome.
    """

    socket: str
    driver: str
    endpoint: str
    services: tuple[str, ...]
    service: str | None
    accepted: bool
    error: str | None
    at: float = field(default_factory=time.monotonic)


class DraInstance:
    """One registered instance (plugin) of a DRA driver: its connection and health stream.

    Attributes:
        driver: the driver name from GetInfo.
        endpoint: the DRA socket the kubelet connects to.
        socket: the registration socket it came through.
        services: ``supported_versions`` from GetInfo.
        service: the DRAPlugin service used for calls (``"v1.DRAPlugin"`` or ``"v1beta1.DRAPlugin"``).
        health_service: the health service the kubelet streams from (``None``: the plugin
            advertises none, and the kubelet opens no health stream).
        connected: whether the kubelet's connection to ``endpoint`` is up right now.
        health_messages: every NodeWatchResources message, as sent.
        health_received_at: ``time.monotonic()`` of each message.
        health_streams: how many times the stream was opened.
        health_error: how the last stream ended (Go's rendering of the status, or ``"EOF"``).
    """

    def __init__(
        self,
        driver: str,
        endpoint: str,
        *,
        socket: str,
        services: tuple[str, ...],
        service: str,
        health_service: str | None,
        channel: grpc.aio.Channel,
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.socket = socket
        self.services = services
        self.service = service
        self.health_service = health_service
        self.registered_at = time.monotonic()
        self.connected = False
        self.health_messages: list[tuple[HealthReport, ...]] = []
        self.health_received_at: list[float] = []
        self.health_streams = 0
        self.health_error: str | None = None
        self.channel = channel
        # Cancelled on deregistration and kubelet stop: ends the monitor and the health stream.
        self.scope = anyio.CancelScope()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "disconnected"
        return f"DraInstance({self.driver!r}, {self.endpoint!r}, {self.service}, {state})"
