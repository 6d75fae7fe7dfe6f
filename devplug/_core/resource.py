"""The lifecycle of one resource: serve, self-dial, register, watch for restarts, repeat.

::

    serve ─► self-dial ─► Register ─► registered ─┐  kubelet.sock replaced, or own socket deleted
      ▲                      │ fails: back-off      │  (state-checked on every inotify change)
      └──── stop old server ◄┴──────────────────────┘

Kubelet >= 1.26 dials the plugin during Register, so the server is always serving first. The
old server is stopped before the new registration (kubernetes issue 121994) and every server
instance gets a fresh socket name (newer kubelets refuse a reused path).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import anyio
import structlog

from devplug._core.backoff import Backoff
from devplug._core.registration import register
from devplug._core.servicer import (
    DevicePluginService,
    ServiceStats,
    WatcherRegistrationService,
    add_services,
)
from devplug._core.sockets import SocketServer, file_identity, unique_socket_name
from devplug._core.state import DeviceState
from devplug.errors import DevplugError, RegistrationError
from devplug.models import Device

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from devplug._core.watch import DirWatcher
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

RestartReason = Literal["start", "kubelet_restarted", "socket_deleted"]


@dataclass
class ResourceStatus:
    """What one resource has done so far: for readiness, metrics and debug dumps."""

    resource: str
    socket: str | None = None
    registered: bool = False
    registrations: list[tuple[float, RestartReason]] = field(default_factory=list)
    """(time.time(), reason) of every accepted registration."""
    last_error: str | None = None
    stats: ServiceStats = field(default_factory=ServiceStats)


class ResourceRunner:
    """Runs one :class:`DevicePlugin` until cancelled."""

    def __init__(self, plugin: DevicePlugin, settings: Settings, watcher: DirWatcher) -> None:
        self.plugin = plugin
        self.settings = settings
        self.watcher = watcher
        self.state = DeviceState()
        self.status = ResourceStatus(plugin.resource_name)
        self._log = structlog.get_logger("devplug.resource").bind(resource=plugin.resource_name)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._feed_devices)
            # Register only once there is a list to send: the kubelet shows no capacity until
            # the first ListAndWatch message, and an empty first list would flap it to zero.
            if self.state.current.version == 0:
                self._log.info("waiting_for_devices")
            await self.state.newer_than(0)
            if self.settings.registration == "watcher":
                await self._run_watcher_mode()
            else:
                await self._run_kubelet_mode()

    # -- devices ------------------------------------------------------------------------------

    async def _feed_devices(self) -> None:
        """Iterate the plugin's ``watch_devices`` into the versioned state, restarting it on errors."""
        backoff = Backoff(initial=0.5, maximum=30.0)
        while True:
            try:
                async for devices in self.plugin.watch_devices():
                    self._publish(devices)
                    backoff.reset()
            except Exception as exc:
                delay = backoff.next()
                self._log.exception("watch_devices_failed", error=str(exc), retry_in=round(delay, 3))
                await anyio.sleep(delay)
                continue
            self._log.warning("watch_devices_ended", keeping=len(self.state.current.devices))
            return

    def _publish(self, devices: object) -> None:
        try:
            items = list(devices)  # type: ignore[call-overload]
            if not all(isinstance(d, Device) for d in items):
                raise TypeError("watch_devices must yield sequences of devplug.Device")
            changed = self.state.publish(items)
        except (TypeError, ValueError) as exc:
            self._log.error("invalid_device_list", error=str(exc))
            return
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
    async def _serving(
        self, directory_watcher: DirWatcher, endpoint: str | None
    ) -> AsyncIterator[SocketServer]:
        """A fresh server on a new socket name in the watched directory; stopped on exit."""
        name = unique_socket_name(self.plugin.resource_name)
        path = directory_watcher.path / name
        service = DevicePluginService(self.plugin, self.state, self._log.bind(socket=name))
        self.status.stats = service.stats
        watcher_service = None
        if endpoint is not None:
            watcher_service = WatcherRegistrationService(
                self.plugin.resource_name,
                endpoint.format(name=name),
                service.stats,
                self._log.bind(socket=name),
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
        reason: RestartReason = "start"
        kubelet = self.settings.kubelet_socket_path
        while True:
            await self._wait_for_kubelet()
            try:
                async with self._serving(self.watcher, None) as server:
                    reason = await self._register_and_watch(server, reason)
            except DevplugError as exc:
                # A socket path we may not use (too long, taken): say why and try a new name.
                self.status.last_error = str(exc)
                self._log.error("serve_failed", error=str(exc))
                await anyio.sleep(1.0)
                continue
            event = "kubelet_restarted" if reason == "kubelet_restarted" else "socket_deleted"
            self._log.info(event, kubelet_socket=str(kubelet))

    async def _wait_for_kubelet(self) -> None:
        kubelet = self.settings.kubelet_socket_path
        logged = False
        while True:
            generation = self.watcher.generation
            if file_identity(kubelet) is not None:
                return
            if not logged:
                self._log.info("waiting_for_kubelet", kubelet_socket=str(kubelet))
                logged = True
            await self.watcher.changed_after(generation)

    async def _register_and_watch(self, server: SocketServer, reason: RestartReason) -> RestartReason:
        """Register (retrying forever), then wait for the next restart signal and return it."""
        settings = self.settings
        kubelet = settings.kubelet_socket_path
        backoff = Backoff(initial=settings.retry_initial, maximum=settings.retry_max)
        started = time.monotonic()
        while True:
            if not server.alive():
                return "socket_deleted"
            identity = file_identity(kubelet)
            try:
                await register(
                    kubelet,
                    self.plugin.resource_name,
                    server.path.name,
                    self.plugin.options(),
                    settings.register_timeout,
                )
                break
            except RegistrationError as exc:
                delay = backoff.next()
                self.status.last_error = str(exc)
                self._log.warning(
                    "register_failed",
                    error=str(exc),
                    code=exc.code,
                    attempt=backoff.attempts,
                    retry_in=round(delay, 3),
                )
                await self._sleep_unless_kubelet_changes(delay, identity)
        self.status.registered = True
        self.status.last_error = None
        self.status.registrations.append((time.time(), reason))
        self._log.info("registered", reason=reason, seconds=round(time.monotonic() - started, 4))
        while True:
            generation = self.watcher.generation
            if not server.alive():
                return "socket_deleted"
            if file_identity(kubelet) != identity:
                return "kubelet_restarted"
            await self.watcher.changed_after(generation)

    async def _sleep_unless_kubelet_changes(
        self, delay: float, identity: tuple[int, int, int] | None
    ) -> None:
        """Back off, but retry at once when a new kubelet.sock appears."""
        kubelet = self.settings.kubelet_socket_path
        with anyio.move_on_after(delay):
            while True:
                generation = self.watcher.generation
                current = file_identity(kubelet)
                if current is not None and current != identity:
                    return
                await self.watcher.changed_after(generation)

    async def _run_watcher_mode(self) -> None:
        host_dir = self.settings.endpoint_host_dir
        # "{name}" is filled with the socket's file name; an empty endpoint tells the kubelet
        # to use the registration socket itself, at the path it found it.
        endpoint = str(host_dir / "{name}") if host_dir is not None else ""
        while True:
            try:
                async with self._serving(self.watcher, endpoint) as server:
                    self.status.registrations.append((time.time(), "start"))
                    while True:
                        generation = self.watcher.generation
                        if not server.alive():
                            break
                        await self.watcher.changed_after(generation)
            except DevplugError as exc:
                self.status.last_error = str(exc)
                self._log.error("serve_failed", error=str(exc))
                await anyio.sleep(1.0)
                continue
            self._log.info("socket_deleted")
