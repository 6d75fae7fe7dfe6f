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
from functools import partial
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
from devplug._core.sockets import SocketServer, SocketUnavailableError, file_identity, unique_socket_name
from devplug._core.state import DeviceState
from devplug.errors import RegistrationError
from devplug.models import Device

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from devplug._core.watch import DirWatcher
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

RestartReason = Literal["start", "kubelet_restarted", "socket_deleted"]
# Why a registration happened; "watcher": the kubelet's plugin watcher reported success.
RegistrationReason = Literal["start", "kubelet_restarted", "socket_deleted", "watcher"]


@dataclass
class ResourceStatus:
    """What one resource has done so far: for readiness, metrics and debug dumps."""

    resource: str
    socket: str | None = None
    registered: bool = False
    registrations: list[tuple[float, RegistrationReason]] = field(default_factory=list)
    """(time.time(), reason) of every accepted registration."""
    last_error: str | None = None
    stats: ServiceStats = field(default_factory=ServiceStats)


def _replaced(path: Path, before: tuple[int, int, int] | None) -> bool | None:
    """True once ``path`` exists and is not the file it was (None otherwise, to keep waiting)."""
    current = file_identity(path)
    return True if current is not None and current != before else None


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
    async def _serving(self, *, plugin_watcher: bool) -> AsyncIterator[SocketServer]:
        """A fresh server on a new socket name in the watched directory; stopped on exit."""
        name = unique_socket_name(self.plugin.resource_name)
        path = self.watcher.path / name
        service = DevicePluginService(self.plugin, self.state, self._log.bind(socket=name))
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
        reason: RestartReason = "start"
        kubelet = self.settings.kubelet_socket_path
        while True:
            if file_identity(kubelet) is None:
                self._log.info("waiting_for_kubelet", kubelet_socket=str(kubelet))
                await self.watcher.wait_for(lambda: file_identity(kubelet))
            try:
                async with self._serving(plugin_watcher=False) as server:
                    reason = await self._register_and_watch(server, reason)
            except SocketUnavailableError as exc:
                await self._serve_failed(exc)
                continue
            event = "kubelet_restarted" if reason == "kubelet_restarted" else "socket_deleted"
            self._log.info(event, kubelet_socket=str(kubelet), socket=self.status.socket)

    async def _run_watcher_mode(self) -> None:
        while True:
            try:
                async with self._serving(plugin_watcher=True) as server:
                    # The kubelet finds the socket again after its own restarts: only a deleted
                    # socket needs a new one.
                    await self.watcher.wait_for(lambda: None if server.alive() else True)
            except SocketUnavailableError as exc:
                await self._serve_failed(exc)
                continue
            self._log.info("socket_deleted", socket=self.status.socket)

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
                log.warning(
                    "register_failed",
                    error=str(exc),
                    code=exc.code,
                    attempt=backoff.attempts,
                    retry_in=round(delay, 3),
                )
                # Back off, but retry at once when a new kubelet.sock appears.
                with anyio.move_on_after(delay):
                    await self.watcher.wait_for(partial(_replaced, kubelet, identity))
        self.status.registered = True
        self.status.last_error = None
        self.status.registrations.append((time.time(), reason))
        log.info("registered", reason=reason, seconds=round(time.monotonic() - started, 4))

        def restart_reason() -> RestartReason | None:
            if not server.alive():
                return "socket_deleted"
            if file_identity(kubelet) != identity:
                return "kubelet_restarted"
            return None

        return await self.watcher.wait_for(restart_reason)

    def _watcher_notified(self, registered: bool, error: str) -> None:
        self.status.registered = registered
        self.status.last_error = error or None
        if registered:
            self.status.registrations.append((time.time(), "watcher"))
