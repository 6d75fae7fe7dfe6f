"""The kubelet's plugin watcher: sockets in ``plugins_registry/`` register themselves.

For each socket that appears (or is there at start) the kubelet dials it, asks GetInfo
(one second), validates the answer, connects to the advertised endpoint through the device
manager and reports the outcome with NotifyRegistrationStatus. Attempts are made by the
kubelet's reconciler, which runs once a second: a new socket waits for its next round (up to a
second), and a failure before the plugin is known to the kubelet is retried at the first round
after a doubling back-off (500 ms, then 1 s, 2 s, ... up to 2 min 2 s) has passed. Deleting
the socket deregisters it.
Type ``DevicePlugin`` is handled here; type ``DRAPlugin`` by a :class:`TypeHandler` when the
kubelet has one (:mod:`devplug.testing._kubelet.dra_watcher`).
"""

from __future__ import annotations

import math
import os
import stat
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio
import grpc
import structlog
from asyncinotify import Inotify, Mask

from devplug.models import PluginOptions
from devplug.testing._kubelet.devices import ConnectError
from devplug.testing._kubelet.resource import Registration
from devplug.testing._kubelet.rpc import DialError, RegistrationInfoClient, dial
from devplug.testing._kubelet.validation import (
    DEVICE_PLUGIN_TYPE,
    STATUS_CUT_BY_STOP,
    go_rpc_error,
    status_not_sent_error,
    validate_plugin_info,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from anyio.abc import TaskGroup, TaskStatus

    from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
    from devplug.testing._kubelet.devices import DeviceManager
    from devplug.testing._kubelet.resource import Endpoint

log = structlog.get_logger(__name__)

# The kubelet's operation executor: first retry after 500 ms, doubling up to 2 min 2 s.
_RETRY_FIRST = 0.5
_RETRY_MAX = 122.0
_NOTIFY_TIMEOUT = 5.0


@dataclass
class _Socket:
    path: Path
    inode: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    endpoint: Endpoint | None = None
    # Set once a plugin of another type is known to the kubelet: what deletion deregisters.
    known: tuple[TypeHandler, str, str] | None = None


class Timeouts(Protocol):
    """Where the watcher reads the kubelet's timeouts, at each use (tests may change them)."""

    dial_timeout: float
    get_info_timeout: float
    reconcile_period: float


class TypeHandler(Protocol):
    """The kubelet's handler for another plugin type (``DRAPlugin``), after GetInfo answered."""

    async def handshake(
        self,
        path: str,
        client: RegistrationInfoClient,
        info: reg_pb.PluginInfo,
        known: Callable[[str, str], None],
    ) -> bool:
        """Validate, register and notify; ``False`` to be tried again later."""

    def failed(self, path: str, error: str) -> None:
        """An attempt failed before GetInfo answered."""

    async def deregister(self, driver: str, endpoint: str) -> None:
        """The registration socket of a known plugin was deleted."""


class PluginWatcher:
    """Watches one plugins_registry directory for registration sockets."""

    def __init__(
        self,
        directory: Path,
        manager: DeviceManager,
        timeouts: Timeouts,
        handlers: Mapping[str, TypeHandler] | None = None,
    ) -> None:
        self.directory = directory
        self._manager = manager
        self._timeouts = timeouts
        self._handlers = handlers or {}
        self._sockets: dict[Path, _Socket] = {}
        self._tg: TaskGroup | None = None
        self._started = time.monotonic()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled; reports started once the watch is set and present sockets are taken."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._started = time.monotonic()
            with Inotify() as inotify:
                inotify.add_watch(self.directory, Mask.CREATE | Mask.MOVED_TO | Mask.DELETE | Mask.MOVED_FROM)
                # Scan after the watch is set so nothing created in between is missed; a socket
                # seen twice (scan and event) is taken once.
                for path in sorted(self.directory.iterdir()):
                    self._found(path)
                task_status.started()
                async for event in inotify:
                    if event.path is None:
                        continue
                    if event.mask & (Mask.CREATE | Mask.MOVED_TO):
                        self._found(event.path)
                    elif event.mask & (Mask.DELETE | Mask.MOVED_FROM) and event.path in self._sockets:
                        self._forget(self._sockets[event.path])

    def _found(self, path: Path) -> None:
        # Like the kubelet: ignore dot files and anything that is not a unix socket.
        # (The kubelet also descends into sub-directories; this fake watches the top level only.)
        if path.name.startswith("."):
            return
        try:
            info = path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            return
        known = self._sockets.get(path)
        if known is not None and known.inode == info.st_ino:
            return
        if known is not None:  # replaced under the same name: the old plugin is gone
            self._forget(known)
        socket = _Socket(path=path, inode=info.st_ino)
        self._sockets[path] = socket
        self._task_group.start_soon(self._register_until_done, socket, name=f"plugin_watcher {path}")

    def _forget(self, socket: _Socket) -> None:
        del self._sockets[socket.path]
        socket.scope.cancel()
        if socket.endpoint is not None:
            log.info("plugin_deregistered", socket=str(socket.path), resource=socket.endpoint.resource)
            self._task_group.start_soon(self._manager.disconnect, socket.endpoint)
        if socket.known is not None:
            handler, name, endpoint = socket.known
            self._task_group.start_soon(handler.deregister, name, endpoint)

    @property
    def _task_group(self) -> TaskGroup:
        if self._tg is None:
            raise RuntimeError("the plugin watcher is not running")
        return self._tg

    async def _register_until_done(self, socket: _Socket) -> None:
        delay = _RETRY_FIRST
        earliest = time.monotonic()
        with socket.scope:
            while True:
                await self._next_round(earliest)
                if await self._register_once(socket):
                    return
                earliest = time.monotonic() + delay
                delay = min(delay * 2, _RETRY_MAX)

    async def _next_round(self, earliest: float) -> None:
        """Sleep until the reconciler's first round at or after ``earliest``."""
        period = self._timeouts.reconcile_period
        if period <= 0:
            await anyio.sleep(max(0.0, earliest - time.monotonic()))
            return
        rounds = math.ceil(max(0.0, earliest - self._started) / period)
        await anyio.sleep(max(0.0, self._started + rounds * period - time.monotonic()))

    async def _register_once(self, socket: _Socket) -> bool:
        """One registration attempt; ``False`` when the kubelet would try again later."""
        path = str(socket.path)
        try:
            channel = await dial(path, within=self._timeouts.dial_timeout)
        except DialError as exc:
            error = f"RegisterPlugin error -- dial failed at socket {path}, err: {exc}"
            self._record("", path, "", None, error)
            self._unknown_type_failed(path, error)
            return False
        try:
            return await self._handshake(socket, RegistrationInfoClient(channel))
        finally:
            # The kubelet closes the registration connection once it has an answer.
            with anyio.CancelScope(shield=True):
                await channel.close(None)

    async def _handshake(self, socket: _Socket, client: RegistrationInfoClient) -> bool:
        path = str(socket.path)
        try:
            info = await client.get_info(deadline=self._timeouts.get_info_timeout)
        except grpc.aio.AioRpcError as exc:
            rpc = go_rpc_error(exc.code().name, exc.details() or "")
            error = (
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo "
                f"at socket {path}, err: {rpc}"
            )
            self._record("", path, "", None, error)
            self._unknown_type_failed(path, error)
            return False
        handler = self._handlers.get(info.type)
        if handler is not None:

            def known(name: str, endpoint: str) -> None:
                socket.known = (handler, name, endpoint)

            return await handler.handshake(path, client, info, known)
        return await self._device_plugin(socket, client, info)

    async def _device_plugin(
        self, socket: _Socket, client: RegistrationInfoClient, info: reg_pb.PluginInfo
    ) -> bool:
        path = str(socket.path)
        name, versions = info.name, ",".join(info.supported_versions)
        endpoint = info.endpoint or path  # empty: the registration socket serves DevicePlugin too
        if info.type != DEVICE_PLUGIN_TYPE:
            error = (
                f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
            )
            await self._notify(client, path, False, error)
            self._record(name, endpoint, versions, None, error)
            return False
        problem = validate_plugin_info(name, list(info.supported_versions))
        if problem is not None:
            error = f"RegisterPlugin error -- plugin validation failed with err: {problem}"
            await self._notify(client, path, False, error)
            self._record(name, endpoint, versions, None, error)
            return False
        # From here on the kubelet counts the plugin as known: a failure is reported, not retried.
        try:
            if not os.path.isabs(endpoint):
                # The kubelet would dial this relative to its own working directory and time
                # out; the fake says why at once.
                raise ConnectError(f"endpoint {endpoint!r} is not an absolute path")
            connected = await self._manager.connect(
                name, endpoint, options=None, dial_timeout=self._timeouts.dial_timeout
            )
        except ConnectError as exc:
            error = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
            await self._notify(client, path, False, error)
            self._record(name, endpoint, versions, None, error)
            return True
        socket.endpoint = connected
        if socket.scope.cancel_called:  # the socket was deleted while connecting
            with anyio.CancelScope(shield=True):
                await self._manager.disconnect(connected)
            return True
        # Stopped while the status is on its way, the plugin was registered (and may have
        # been called) all the same: it counts as accepted, with the status unsent.
        notify_error: str | None = status_not_sent_error(path, STATUS_CUT_BY_STOP)
        try:
            notify_error = await self._notify(client, path, True, "")
        finally:
            self._record(name, endpoint, versions, connected.options, notify_error, accepted=True)
        log.info("plugin_registered", resource=name, socket=path, endpoint=endpoint)
        return True

    def _unknown_type_failed(self, path: str, error: str) -> None:
        # Before GetInfo answers, the plugin's type is unknown: every handler hears of it.
        for handler in self._handlers.values():
            handler.failed(path, error)

    async def _notify(
        self, client: RegistrationInfoClient, path: str, registered: bool, error: str
    ) -> str | None:
        try:
            await client.notify(registered, error, deadline=_NOTIFY_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            rpc = go_rpc_error(exc.code().name, exc.details() or "")
            return status_not_sent_error(path, rpc)
        return None

    def _record(
        self,
        resource: str,
        endpoint: str,
        versions: str,
        options: PluginOptions | None,
        error: str | None,
        *,
        accepted: bool = False,
    ) -> None:
        if not accepted:
            log.info("plugin_registration_failed", socket=endpoint, resource=resource, error=error)
        registration = Registration(
            resource=resource,
            endpoint=endpoint,
            version=versions,
            options=options or PluginOptions(),
            accepted=accepted,
            error=error,
            via="watcher",
        )
        self._manager.record(registration)
