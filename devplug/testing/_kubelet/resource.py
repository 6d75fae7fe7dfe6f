"""What the fake kubelet records: registration attempts, connections, and per-resource device tables."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import anyio

from devplug.models import Device, Health, PluginOptions

if TYPE_CHECKING:
    from devplug.testing._kubelet.rpc import PluginClient, RawDevice


@dataclass(frozen=True)
class Registration:
    """One registration attempt the fake kubelet saw, accepted or not.

    ``endpoint`` is the ``RegisterRequest.endpoint`` as sent (a file name under the device-plugin
    directory) for ``via="register"``; for ``via="watcher"`` it is the DevicePlugin endpoint
    (``PluginInfo.endpoint``, or the registration socket when that is empty), or the
    registration socket when the attempt failed before GetInfo answered, in which case
    ``resource`` is empty too. ``version`` is the requested version, or the plugin's supported
    versions joined with commas for the watcher. ``options`` are RegisterRequest's for
    ``via="register"`` and GetDevicePluginOptions' for the watcher (defaults when not reached).
    ``error`` is the kubelet's text (through the watcher, a kubelet stopped while it sent the
    registration status has registered the plugin all the same, and says ``context canceled``).
    ``at`` is ``time.monotonic()`` of the attempt's outcome.
    ``serving_at_register`` says whether the endpoint socket accepted connections at the moment
    ``Register`` arrived (``None`` for the watcher, which only dials sockets it found): kubelet
    >= 1.26 dials the plugin during Register, so a plugin must serve first. The fake kubelet
    only records this; like the kubelet, it still gives a late server its 10 s dial.
    """

    resource: str
    endpoint: str
    version: str
    options: PluginOptions
    accepted: bool
    error: str | None
    via: Literal["register", "watcher"]
    at: float = field(default_factory=time.monotonic)
    serving_at_register: bool | None = None


class Endpoint:
    """One connection from the kubelet to a plugin's DevicePlugin service, and its ListAndWatch."""

    def __init__(self, resource: str, path: str, client: PluginClient, options: PluginOptions) -> None:
        self.resource = resource
        self.path = path
        self.client = client
        self.options = options
        self.raw_lists: list[list[RawDevice]] = []
        # The stream opens right after the connection is made; when each message arrived.
        self.connected_at = time.monotonic()
        self.received_at: list[float] = []
        # Cancelled to end the stream from the kubelet's side (replacement, deregistration,
        # kill_stream); the stream task enters it.
        self.scope = anyio.CancelScope()
        self.stopped = False
        # Forgotten by the kubelet's registration server (its path registered again while it was
        # connected): the end of its stream no longer disconnects it.
        self.orphaned = False
        self.closed = anyio.Event()
        self._closing = False

    async def close(self) -> None:
        """Close the connection once (later calls wait for it); the plugin sees its stream cancelled."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.stopped = True
        self.scope.cancel()
        with anyio.CancelScope(shield=True):
            await self.client.close()
        self.closed.set()


class ResourceView:
    """A live view of one registered resource, as the kubelet's device manager holds it.

    The device table follows the kubelet: each ListAndWatch message (of any of the resource's
    connected endpoints) replaces it, only health ``"Healthy"`` (exactly) counts, and when the
    last connected endpoint's stream ends every device turns unhealthy until a new list arrives.
    The table outlives a re-registration of the same resource (the kubelet keeps it until the
    new endpoint sends its first list); ``raw_lists`` and ``messages`` are those of the current
    connection only.
    """

    def __init__(self, name: str, endpoint: Endpoint) -> None:
        self.name = name
        self._current: Endpoint = endpoint
        # The connected endpoints by socket path (the kubelet's endpoint store); the newest is
        # ``_current``, the one calls go to.
        self._store: dict[str, Endpoint] = {}
        self._last: list[RawDevice] = []
        self._stream_ended = False
        # The kubelet keeps two ID sets per resource; capacity and allocatable count them.
        self._healthy: set[str] = set()
        self._unhealthy: set[str] = set()

    @property
    def endpoint(self) -> str:
        """The socket path the kubelet dialled for the current connection."""
        return self._current.path

    @property
    def options(self) -> PluginOptions:
        """The options in force: GetDevicePluginOptions' reply, or the RegisterRequest's (kubelet <= 1.25)."""
        return self._current.options

    @property
    def raw_lists(self) -> list[list[RawDevice]]:
        """Every ListAndWatch message received on the current connection, unvalidated."""
        return self._current.raw_lists

    @property
    def connected_at(self) -> float:
        """``time.monotonic()`` when the current connection was made (its ListAndWatch opens then)."""
        return self._current.connected_at

    @property
    def received_at(self) -> list[float]:
        """``time.monotonic()`` of each message in ``raw_lists``, on the current connection."""
        return self._current.received_at

    @property
    def messages(self) -> int:
        """How many ListAndWatch messages the current connection has delivered."""
        return len(self._current.raw_lists)

    @property
    def connected(self) -> bool:
        """Whether the current connection is open and its ListAndWatch stream running."""
        return not self._current.stopped

    @property
    def devices(self) -> tuple[Device, ...]:
        """The device table as the kubelet sees it now, in the order last sent.

        Values are as the plugin sent them (not re-validated); any health other than exactly
        ``"Healthy"`` reads as ``Health.UNHEALTHY``, and so does every device once the stream ended.
        """
        return tuple(
            Device.model_construct(
                id=device_id,
                health=Health.HEALTHY if health == "Healthy" and not self._stream_ended else Health.UNHEALTHY,
                numa_nodes=numa,
            )
            for device_id, health, numa in self._last
        )

    @property
    def capacity(self) -> int:
        """Distinct device IDs, healthy or not, as the kubelet counts them for node capacity."""
        return len(self._healthy) + len(self._unhealthy)

    @property
    def allocatable(self) -> int:
        """Distinct healthy device IDs: what new pods may be given."""
        return len(self._healthy)

    def _apply(self, devices: list[RawDevice]) -> None:
        """Replace the device table with one ListAndWatch message (never a delta)."""
        self._last = devices
        self._stream_ended = False
        self._healthy = {d[0] for d in devices if d[1] == "Healthy"}
        self._unhealthy = {d[0] for d in devices if d[1] != "Healthy"}

    def _mark_unhealthy(self) -> None:
        """What the kubelet does when the current stream ends: nothing stays allocatable."""
        self._stream_ended = True
        self._unhealthy |= self._healthy
        self._healthy = set()

    def __repr__(self) -> str:
        table = ", ".join(f"{d.id}:{d.health.value}" for d in self.devices)
        return (
            f"ResourceView(name={self.name!r}, endpoint={self.endpoint!r}, connected={self.connected}, "
            f"messages={self.messages}, devices=[{table}])"
        )
