"""The lifecycle of one resource: serve, self-dial, register, watch for restarts, repeat.

::

    serve ─► self-dial ─► Register ─► registered ─┐  kubelet.sock replaced, own socket deleted, or
      ▲                      │ fails: back-off      │  the servers that took over gone (state-
      └──── stop old server ◄┴──────────────────────┘  checked on every inotify change)

Kubelet >= 1.26 dials the plugin during Register, so the server is always serving first. The
old server is stopped before the new registration (kubernetes issue 121994) and every server
instance gets a fresh socket name (newer kubelets refuse a reused path). A server that another
copy of the plugin replaced registers again when that copy stops (see :mod:`.rivals`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal

import anyio
import structlog

from devplug._device_plugin.cdi_sync import CdiSync
from devplug._device_plugin.registration import register
from devplug._device_plugin.rivals import RivalWatch
from devplug._device_plugin.servicer import (
    DevicePluginService,
    ServiceStats,
    WatcherRegistrationService,
    add_services,
)
from devplug._device_plugin.telemetry import ResourceCounters
from devplug._hooks import advertised_options, overrides
from devplug._runtime.backoff import Backoff
from devplug._runtime.feed import feed_devices
from devplug._runtime.sockets import SocketServer, SocketUnavailableError, file_identity, unique_socket_name
from devplug._runtime.state import DeviceState
from devplug.errors import RegistrationError
from devplug.models import Health

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from devplug._runtime.ledger import Ledger
    from devplug._runtime.watch import DirWatcher
    from devplug.models import Device
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

RestartReason = Literal["start", "replaced", "kubelet_restarted", "socket_deleted", "rival_stopped"]
# Why a registration happened; "replaced": the resource was restarted with a new plugin or new
# settings (a reload); "rival_stopped": the copies of the plugin that took the resource over
# since the last registration stopped; "watcher": the kubelet's plugin watcher reported success.
RegistrationReason = Literal[
    "start", "replaced", "kubelet_restarted", "socket_deleted", "rival_stopped", "watcher"
]


@dataclass
class ResourceStatus:
    """What one resource has done so far: for readiness, metrics and debug dumps."""

    resource: str
    socket: str | None = None
    registered: bool = False
    registrations: list[tuple[float, RegistrationReason]] = field(default_factory=list)
    """(time.time(), reason) of every accepted registration of this resource name in this
    process (a restarted resource keeps the history)."""
    last_error: str | None = None
    stats: ServiceStats = field(default_factory=ServiceStats)


class ResourceRunner:
    """Runs one :class:`DevicePlugin` until cancelled."""

    def __init__(
        self,
        plugin: DevicePlugin,
        settings: Settings,
        watcher: DirWatcher,
        *,
        counters: ResourceCounters | None = None,
        first_reason: RestartReason = "start",
        ledger: Ledger | None = None,
    ) -> None:
        self.plugin = plugin
        self.settings = settings
        self.watcher = watcher
        self.state = DeviceState()
        """The devices as the plugin lists them."""
        self.ledger = ledger
        self.served = DeviceState() if ledger is not None else self.state
        """The devices as the kubelet is sent them: with a ledger (both APIs served), those
        held through DRA are Unhealthy (the kubelet neither counts nor assigns them)."""
        self._stop_listening: Callable[[], None] | None = None
        self.counters = counters if counters is not None else ResourceCounters(plugin.resource_name)
        self._first_reason: RestartReason = first_reason
        # The history is the counters' list: a restarted resource keeps it.
        self.status = ResourceStatus(
            plugin.resource_name,
            registrations=self.counters.registrations,  # type: ignore[arg-type]
        )
        self._log = structlog.get_logger("devplug.resource").bind(resource=plugin.resource_name)
        # Only plugins that define cdi_spec pay for it.
        self._cdi = (
            CdiSync(plugin, settings.cdi_dir, self._log) if overrides(type(plugin), "cdi_spec") else None
        )
        # The directory of its sockets (the host's watch may cover others: a DRA driver's too).
        watcher_mode = settings.registration == "watcher"
        self.socket_dir = settings.plugins_registry_dir if watcher_mode else settings.device_plugin_dir
        self._rivals = RivalWatch(plugin.resource_name, self.socket_dir, self._log)

    async def run(self) -> None:
        ledger = self.ledger
        if ledger is not None:
            self._stop_listening = ledger.listen(self._mask)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._feed_devices)
                tg.start_soon(self._rivals.run, self.watcher)
                # Register only once there is a list to send: the kubelet shows no capacity until
                # the first ListAndWatch message, and an empty first list would flap it to zero.
                if self.state.current.version == 0:
                    self._log.info("waiting_for_devices")
                await self.state.newer_than(0)
                if ledger is not None and not ledger.ready:
                    # Both APIs: no device is offered before the holders of both are known.
                    self._log.info("waiting_for_holders")
                    await ledger.changes.wait_for(lambda _: True if ledger.ready else None)
                    self._mask()
                if self.settings.registration == "watcher":
                    await self._run_watcher_mode()
                else:
                    await self._run_kubelet_mode()
        except anyio.get_cancelled_exc_class():
            # Stopped (shutdown or resource removed), not failed: a failed run is restarted
            # and must not leave a gap in the spec the runtime reads.
            if self._cdi is not None and self.plugin.remove_cdi_spec_on_stop:
                self._cdi.remove()
            raise
        finally:
            if self._stop_listening is not None:
                self._stop_listening()
                self._stop_listening = None

    def _mask(self) -> None:
        """Publish the served set: the plugin's, with the devices DRA holds Unhealthy."""
        ledger = self.ledger
        if ledger is None or self.state.current.version == 0:
            return
        resource = self.plugin.resource_name
        served = []
        for device in self.state.current.devices:
            why = ledger.from_plugin(resource, device.id)
            served.append(device if why is None else device.with_health(Health.UNHEALTHY, str(why)))
        self.served.publish(served)

    # -- devices ------------------------------------------------------------------------------

    async def _feed_devices(self) -> None:
        """Iterate the plugin's ``watch_devices`` into the versioned state (see :mod:`.feed`)."""

        async def publish(items: tuple[Device, ...]) -> int:
            await self._before_publish(items)
            self._publish(items)
            return len(self.state.current.devices)

        await feed_devices(self.plugin, publish, self._log)

    async def _before_publish(self, items: tuple[Device, ...]) -> None:
        """Write the CDI spec of a new device set before the kubelet can see the set."""
        current = self.state.current
        if self._cdi is None or (current.version > 0 and current.devices == items):
            return
        if len({d.id for d in items}) == len(items):  # duplicates: publish refuses the set
            await self._cdi.update(items)

    def _publish(self, items: tuple[Device, ...]) -> None:
        before = self.state.current
        try:
            changed = self.state.publish(items)
        except ValueError as exc:
            self._log.error("invalid_device_list", error=str(exc))
            return
        self.counters.count_transitions(before, self.state.current)
        self._mask()
        if changed:
            snapshot = self.state.current
            self._log.info(
                "devices_changed",
                version=snapshot.version,
                devices=len(snapshot.devices),
                healthy=sum(d.healthy for d in snapshot.devices),
            )

    # -- serving ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _serving(self, *, plugin_watcher: bool) -> AsyncIterator[SocketServer]:
        """A fresh server on a new socket name in the watched directory; stopped on exit."""
        name = unique_socket_name(self.plugin.resource_name)
        self._rivals.own.add(name)  # before it exists: its creation is no rival's
        path = self.socket_dir / name
        service = DevicePluginService(
            self.plugin,
            self.served,
            self._log.bind(socket=name),
            host_path_check=self.settings.host_path_check,
            host_root=self.settings.host_root,
            counters=self.counters,
            ledger=self.ledger,
        )
        self.status.stats = service.stats
        watcher_service = None
        if plugin_watcher:
            # An empty endpoint tells the kubelet to use this socket at the path it found it;
            # a container that sees the directory elsewhere says where the host has it.
            host_dir = self.settings.endpoint_host_dir
            watcher_service = WatcherRegistrationService(
                self.plugin.resource_name,
                str(host_dir / name) if host_dir is not None else "",
                service.stats,
                self._log.bind(socket=name),
                self._watcher_notified,
            )
        server = SocketServer(path, lambda s: add_services(s, service, watcher_service))
        try:
            await server.start()
            self.status.socket = name
            self._log.info("serving", socket=name)
            yield server
        finally:
            self.status.registered = False
            with anyio.CancelScope(shield=True):
                # Streams first: they would hold the whole grace period; unary calls in flight
                # (an Allocate) get the grace period to finish.
                service.close_streams()
                await server.stop(self.settings.shutdown_grace)
            self._log.info("stopped", socket=name)

    async def _run_kubelet_mode(self) -> None:
        reason = self._first_reason
        kubelet = self.settings.kubelet_socket_path
        while True:
            if file_identity(kubelet) is None:
                self._log.info("waiting_for_kubelet", kubelet_socket=str(kubelet))
                await self.watcher.wait_for(lambda: file_identity(kubelet))
            # The kubelet creates the sockets' directory (the watcher says when it is missing).
            await self.watcher.wait_present(self.socket_dir)
            try:
                async with self._serving(plugin_watcher=False) as server:
                    reason = await self._register_and_watch(server, reason)
            except SocketUnavailableError as exc:
                await self._serve_failed(exc)
                continue
            self._log.info(reason, kubelet_socket=str(kubelet), socket=self.status.socket)

    async def _run_watcher_mode(self) -> None:
        while True:
            await self.watcher.wait_present(self.socket_dir)
            try:
                async with self._serving(plugin_watcher=True) as server:
                    reason = await self._watcher_restart(server)
            except SocketUnavailableError as exc:
                await self._serve_failed(exc)
                continue
            self._log.info(reason, socket=self.status.socket)

    async def _watcher_restart(self, server: SocketServer) -> RestartReason:
        """Wait until the socket needs serving anew in plugin-watcher mode: the kubelet finds it
        again after its own restarts, so only its deletion, or the end of the copies that took
        the resource over, calls for a new one."""
        successors = self._rivals.successors()

        def restart_reason() -> RestartReason | None:
            if not server.alive():
                return "socket_deleted"
            return "rival_stopped" if successors.all_gone() else None

        return await self.watcher.wait_for(restart_reason)

    async def _serve_failed(self, exc: SocketUnavailableError) -> None:
        # A socket path that may not be used (too long, taken): say why, then try a new name.
        self.status.last_error = str(exc)
        self._log.error("serve_failed", error=str(exc))
        await anyio.sleep(1.0)

    async def _register_and_watch(self, server: SocketServer, reason: RestartReason) -> RestartReason:
        """Register (retrying forever), then wait for the next restart signal and return it."""
        settings = self.settings
        kubelet = settings.kubelet_socket_path
        backoff = Backoff(initial=settings.retry_initial, maximum=settings.retry_max)
        log = self._log.bind(socket=server.path.name)
        started = time.monotonic()

        def restart_reason(kubelets_seen: int) -> RestartReason | None:
            if not server.alive():
                return "socket_deleted"
            if self.watcher.creations(kubelet) != kubelets_seen:
                return "kubelet_restarted"
            return None

        while True:
            # Read before the call: a kubelet that restarts while Register is in flight must
            # count as a restart, whichever kubelet answered.
            seen = self.watcher.creations(kubelet)
            if restart_reason(seen) == "socket_deleted":
                return "socket_deleted"
            # Also before the call: a copy whose socket appears while Register is in flight
            # (or just after) registers after this one, and takes the resource over.
            successors = self._rivals.successors()
            outcome = await self._watched(
                register(
                    kubelet,
                    self.plugin.resource_name,
                    server.path.name,
                    advertised_options(type(self.plugin)),
                    settings.register_timeout,
                ),
                partial(restart_reason, seen),
            )
            if outcome is None:
                break
            if outcome == "socket_deleted":
                return "socket_deleted"
            if outcome == "kubelet_restarted":
                continue  # a new kubelet: register with it now
            assert isinstance(outcome, RegistrationError)
            delay = backoff.next()
            self.status.last_error = str(outcome)
            log.warning(
                "register_failed",
                error=str(outcome),
                code=outcome.code,
                attempt=backoff.attempts,
                retry_in=round(delay, 3),
            )
            # Back off, but retry at once for a new kubelet.sock, and start over with a new
            # socket if the kubelet deleted this one.
            with anyio.move_on_after(delay):
                if await self.watcher.wait_for(partial(restart_reason, seen)) == "socket_deleted":
                    return "socket_deleted"
        self.status.registered = True
        self.status.last_error = None
        self.status.registrations.append((time.time(), reason))
        log.info("registered", reason=reason, seconds=round(time.monotonic() - started, 4))

        def next_reason() -> RestartReason | None:
            why = restart_reason(seen)
            if why is None and successors.all_gone():
                # The kubelet took the resource over to another copy, which stopped since.
                return "rival_stopped"
            return why

        return await self.watcher.wait_for(next_reason)

    async def _watched(
        self, call: Awaitable[None], interrupt: Callable[[], RestartReason | None]
    ) -> RestartReason | RegistrationError | None:
        """Await ``call`` (a Register) unless a restart signal comes first.

        Returns None when it succeeded, its RegistrationError, or the signal that cut it short:
        a kubelet may hold Register for seconds (dialling back a socket that a restart has
        already deleted), and waiting that out would leave the new kubelet without the plugin.
        """
        outcome: RestartReason | RegistrationError | None = None
        # Both sides run as child tasks and the first to finish cancels the other: the task
        # awaiting this method is never the one cancelled.
        async with anyio.create_task_group() as tg:

            async def run_call() -> None:
                nonlocal outcome
                try:
                    await call
                except RegistrationError as exc:
                    outcome = exc
                tg.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal outcome
                outcome = await self.watcher.wait_for(interrupt)
                tg.cancel_scope.cancel()

            tg.start_soon(run_call)
            tg.start_soon(watch)
        return outcome

    def _watcher_notified(self, registered: bool, error: str) -> None:
        self.status.registered = registered
        self.status.last_error = error or None
        if registered:
            self.status.registrations.append((time.time(), "watcher"))
