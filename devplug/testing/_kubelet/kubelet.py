"""FakeKubelet: the kubelet's device manager, served on real unix sockets for tests."""

from __future__ import annotations

import asyncio
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import structlog

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug.models import PluginOptions
from devplug.testing._kubelet.actions import KubeletActions
from devplug.testing._kubelet.devices import ConnectError, DeviceManager
from devplug.testing._kubelet.dra_actions import DraActions
from devplug.testing._kubelet.dra_manager import DraManager
from devplug.testing._kubelet.dra_validation import DRA_PLUGIN_TYPE
from devplug.testing._kubelet.dra_watcher import DraRegistrar
from devplug.testing._kubelet.pod_resources import pod_resources_server
from devplug.testing._kubelet.pods import PodTable
from devplug.testing._kubelet.resource import Registration
from devplug.testing._kubelet.rpc import registration_server
from devplug.testing._kubelet.validation import (
    CHECKPOINT,
    KUBELET_SOCKET,
    check_unix_path,
    join_endpoint,
    validate_register,
)
from devplug.testing._kubelet.watcher import PluginWatcher

if TYPE_CHECKING:
    from types import EllipsisType, TracebackType

    from devplug.testing._kubeapi.server import FakeKubeAPI

log = structlog.get_logger(__name__)

POD_RESOURCES_SOCKET = "pod-resources/kubelet.sock"
"""The pod-resources API's socket, relative to the kubelet's root (the device-plugin directory's parent)."""


class FakeKubelet(DraActions, KubeletActions):
    """A kubelet device manager that plugins register with, over real gRPC on unix sockets.

    It behaves as kubelet 1.37 does, as observed in the project's tests against the real one.
    It validates and answers ``Register`` with the kubelet's error texts, dials the plugin back
    (synchronously, like kubelet >= 1.26, or in the background, like <= 1.25), keeps one
    ListAndWatch per connection and the device table it implies, and restarts the way a
    kubelet does: every socket in the directory deleted and ``kubelet.sock`` created afresh.
    A resource may have several endpoints (one per socket path: the newest takes the calls, the
    others stay connected); a path that registers again while connected is refused and, as in
    that kubelet, left stuck (see :mod:`devplug.testing._kubelet.devices`). With
    ``plugins_registry_dir`` it also runs the plugin watcher.

    With ``dra=True`` (and ``plugins_registry_dir``) it is also the kubelet's DRA manager (from
    1.34): the watcher registers ``DRAPlugin`` sockets (the first service of the plugin's list
    that the kubelet knows, an endpoint used twice refused), keeps a connection to each instance
    and a health stream (the newest DRAResourceHealth service the plugin advertises, none when
    it advertises none; 1.34-1.36 opened v1alpha1 regardless), calls NodePrepareResources /
    NodeUnprepareResources (:meth:`prepare`, :meth:`unprepare`) and checks the answers as the
    kubelet does. Given a ``kube_api`` (:class:`FakeKubeAPI`), it deletes every ResourceSlice of
    ``node_name`` at each (re)start, and a driver's slices of the node ``wipe_delay`` seconds
    after it became unusable (no instance connected), unless one connects in time. A restart
    registers the sockets of ``plugins_registry_dir`` afresh and forgets the prepared claims.

    It also serves the kubelet's pod-resources API (``v1.PodResourcesLister``: List, Get,
    GetAllocatableResources) on ``pod_resources_socket``, from its own pods, as the kubelet does
    (see :mod:`devplug.testing._kubelet.pod_resources`). A pod is named in the call that gives
    it devices: ``allocate(..., pod="ns/name")`` records the Allocate under that pod's container
    (``"name"`` is in ``default``; a :class:`~devplug.testing.PodRef` names the container, else
    ``main``), ``prepare(..., pod=...)`` the driver's devices of each claim. Without ``pod``
    nothing is recorded. :meth:`end_pod` ends a pod (it leaves the table, claims stay prepared
    until :meth:`unprepare`, as in the kubelet once a claim's last pod is gone); :attr:`pods` is
    the table. Pods survive restarts (their containers keep running), and so do the devices
    recorded with them, as the kubelet's checkpoints keep them.

    Use it as an async context manager (or ``start()``/``stop()``), on anyio's asyncio backend.
    The timeouts the kubelet uses are attributes, so a test may shorten them on an instance:
    ``dial_timeout`` (10 s), ``get_info_timeout`` (1 s), ``pre_start_timeout`` (30 s), and
    ``reconcile_period`` (1 s: the plugin watcher's registration attempts are made in rounds
    this far apart, as the kubelet's reconciler makes them; 0 makes them at once).

    Errors from the helpers are ``KubeletError``: the plugin's own gRPC status (``code`` is its
    name, the message its details); ``"UNKNOWN"`` for the kubelet's own complaints about a reply
    (no container response); ``"FAILED_PRECONDITION"`` for calls the kubelet would not make
    (resource not registered, its stream ended, an option not advertised).

    Where it knowingly differs from a kubelet: a resource whose stream ended is kept (the
    kubelet drops it after 5 minutes); the plugin watcher looks at the top level of
    ``plugins_registry_dir`` only, and refuses a relative endpoint at once instead of timing out
    dialling it. In DRA mode: the start-up wipe is done before the watcher runs (the kubelet
    does it in the background) and acts on the FakeKubeAPI's store directly, so API outages and
    injected faults do not delay it; the health cache is not checkpointed; a relative DRA
    endpoint is refused at registration (the kubelet would never connect); pods are not read
    from the API: :meth:`prepare` takes the claims (no claim is read from the API, nothing is
    skipped as already prepared), and refuses a device without pool or device name (the
    kubelet stores it as it comes). A pod exists only as the test names it (see above): the
    pod-resources API lists only the containers that got devices, and an :meth:`unprepare` of
    a claim a listed pod still uses leaves it listed (the kubelet unprepares only claims no
    running pod uses).

    Attributes:
        device_plugin_dir: the absolute device-plugin directory.
        socket_path: ``<device_plugin_dir>/kubelet.sock``.
        plugins_registry_dir: the absolute plugin-watcher directory, or ``None``.
        sync_register: kubelet >= 1.26 behaviour (``True``) or <= 1.25 (``False``).
        node_name: the node whose ResourceSlices the DRA mode wipes.
        pod_resources_socket: the absolute path the pod-resources API is served on, or ``None``.
    """

    dial_timeout: float = 10.0
    get_info_timeout: float = 1.0
    pre_start_timeout: float = 30.0
    reconcile_period: float = 1.0

    def __init__(
        self,
        device_plugin_dir: Path | str,
        *,
        plugins_registry_dir: Path | str | None = None,
        sync_register: bool = True,
        dra: bool = False,
        kube_api: FakeKubeAPI | None = None,
        node_name: str = "node-1",
        pod_resources_socket: Path | str | EllipsisType | None = ...,
    ) -> None:
        """Prepare a kubelet for ``device_plugin_dir``; nothing is created until ``start()``.

        Args:
            dra: also be the DRA manager (needs ``plugins_registry_dir``).
            kube_api: the API server whose ResourceSlices of ``node_name`` the DRA manager wipes.
            node_name: this kubelet's node.
            pod_resources_socket: where to serve the pod-resources API; by default the
                kubelet's ``<root>/pod-resources/kubelet.sock``, the root being the parent of
                ``device_plugin_dir``; ``None``: not served.

        Raises:
            ValueError: a socket path would exceed the 107 bytes AF_UNIX allows; DRA mode
                without ``plugins_registry_dir``; ``kube_api`` without ``dra``.
        """
        self.device_plugin_dir = Path(device_plugin_dir).absolute()
        self.socket_path = self.device_plugin_dir / KUBELET_SOCKET
        check_unix_path(str(self.socket_path))
        if pod_resources_socket is ...:
            pod_resources_socket = self.device_plugin_dir.parent / POD_RESOURCES_SOCKET
        self.pod_resources_socket = (
            Path(pod_resources_socket).absolute() if pod_resources_socket is not None else None
        )
        if self.pod_resources_socket is not None:
            check_unix_path(str(self.pod_resources_socket))
        self.plugins_registry_dir = Path(plugins_registry_dir).absolute() if plugins_registry_dir else None
        if self.plugins_registry_dir is not None:
            check_unix_path(str(self.plugins_registry_dir / "x.sock"))
        self.sync_register = sync_register
        if dra and self.plugins_registry_dir is None:
            raise ValueError("the DRA mode needs plugins_registry_dir: DRA drivers register there")
        if kube_api is not None and not dra:
            raise ValueError("kube_api is for the DRA mode: pass dra=True")
        self.node_name = node_name
        self._dra = DraManager(self, kube_api, node_name) if dra else None
        self._manager = DeviceManager()
        self._pods = PodTable()
        self._server: grpc.aio.Server | None = None
        self._pod_resources_server: grpc.aio.Server | None = None
        self._service: asyncio.Task[None] | None = None
        self._stopping: anyio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start as a kubelet does: clean the socket directory, then serve ``kubelet.sock``.

        Every socket in the device-plugin directory is deleted (the checkpoint file is kept),
        so plugins from before must register again. Sockets already in ``plugins_registry_dir``
        are picked up by the watcher. The pod-resources API is served (its directory created,
        a socket left there replaced) before ``kubelet.sock`` appears.
        """
        if self._server is not None:
            raise RuntimeError("FakeKubelet is already running")
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        _remove_sockets(self.device_plugin_dir)
        self._manager.reset()
        if self._dra is not None:
            self._dra.start()
        # Background work lives in a task of its own, not in the caller's task group, so that
        # stop() and restart() may be called from any task and inside any cancel scope.
        ready = anyio.Event()
        self._stopping = anyio.Event()
        service = asyncio.get_running_loop().create_task(self._serve(self._stopping, ready))
        self._service = service
        await ready.wait()
        if self._manager.task_group is None:  # it failed before it was ready
            self._service = None
            await asyncio.wait([service])
            service.result()
        server = registration_server(str(self.socket_path), self._register)
        self._server = server
        try:
            # Shielded, as the runtime's own servers: a grpc.aio server cancelled while it
            # starts cannot be stopped (its shutdown raises InvalidStateError), which a Ctrl-C
            # ending `devplug demo --dra` at that moment showed as "failed: invalid state".
            with anyio.CancelScope(shield=True):
                if self.pod_resources_socket is not None:
                    # The kubelet's directory mode; its listener replaces a socket left there.
                    self.pod_resources_socket.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
                    self._pod_resources_server = pod_resources_server(
                        str(self.pod_resources_socket), self._pods, self._allocatable_devices
                    )
                    await self._pod_resources_server.start()
                await server.start()
        except BaseException:
            await self.stop()
            raise
        log.info(
            "kubelet_started",
            socket=str(self.socket_path),
            sync_register=self.sync_register,
            pod_resources=str(self.pod_resources_socket),
        )

    async def _serve(self, stopping: anyio.Event, ready: anyio.Event) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._manager.task_group = tg
                handlers = None
                if self._dra is not None:
                    self._dra.task_group = tg
                    handlers = {DRA_PLUGIN_TYPE: DraRegistrar(self._dra)}
                if self.plugins_registry_dir is not None:
                    self.plugins_registry_dir.mkdir(parents=True, exist_ok=True)
                    watcher = PluginWatcher(self.plugins_registry_dir, self._manager, self, handlers)
                    await tg.start(watcher.run)
                ready.set()
                await stopping.wait()
                tg.cancel_scope.cancel()
        except Exception:
            if ready.is_set():  # else start() raises it
                log.exception("kubelet_task_failed")
                return
            raise
        finally:
            self._manager.task_group = None
            if self._dra is not None:
                self._dra.task_group = None
            ready.set()

    async def stop(self, *, crash: bool = False) -> None:
        """Stop serving, close every plugin connection (their streams end), remove ``kubelet.sock``
        and the pod-resources socket.

        With ``crash``, ``kubelet.sock`` stays behind, dead, as after a killed kubelet (the next
        start removes it), and so does the pod-resources socket. The pods are kept (see
        :meth:`restart`). Safe to call twice, and from any task.
        """
        server, self._server = self._server, None
        if server is None:
            return
        with anyio.CancelScope(shield=True):
            await server.stop(None)
            pod_resources, self._pod_resources_server = self._pod_resources_server, None
            if pod_resources is not None:
                await pod_resources.stop(None)
            if self._stopping is not None:
                self._stopping.set()
            service, self._service = self._service, None
            if service is not None:
                await asyncio.wait([service])
            await self._manager.close_all()
            if self._dra is not None:
                await self._dra.close_all()
            if not crash:
                self.socket_path.unlink(missing_ok=True)
            if self.pod_resources_socket is not None and pod_resources is not None:
                if crash:
                    _leave_dead_socket(self.pod_resources_socket)
                else:
                    self.pod_resources_socket.unlink(missing_ok=True)
        log.info("kubelet_stopped", socket=str(self.socket_path))

    async def restart(self, *, downtime: float = 0.0, crash: bool = False) -> None:
        """Restart like a kubelet: stop, forget every resource, delete the sockets, start afresh.

        Plugins see ``kubelet.sock`` deleted, their own sockets deleted, and (after ``downtime``
        seconds) a new ``kubelet.sock`` created, and must register again. The pods keep running
        with their devices: the pod-resources API lists them again once it is back. Note that
        the file system may give the new ``kubelet.sock`` the old one's inode number (ext4
        does): detect restarts by inotify, not by comparing inodes. With ``crash``, the old
        ``kubelet.sock`` stays, dead, until the new kubelet starts (a killed kubelet leaves it
        behind), and so does the pod-resources socket.
        """
        await self.stop(crash=crash)
        self._manager.reset()
        _remove_sockets(self.device_plugin_dir)
        log.info("kubelet_restarting", downtime=downtime)
        if downtime > 0:
            await anyio.sleep(downtime)
        await self.start()

    # -- Register ----------------------------------------------------------------------------------

    async def _register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.Empty:
        resource = request.resource_name
        sent_options = PluginOptions(
            pre_start_required=request.options.pre_start_required,
            get_preferred_allocation_available=request.options.get_preferred_allocation_available,
        )
        path = join_endpoint(str(self.device_plugin_dir), request.endpoint)
        # Recorded, not enforced: the kubelet's dial blocks for up to 10 s, so a plugin that
        # registers first and serves a moment later usually gets away with it.
        serving = _accepts_connections(path)
        error = validate_register(request.version, resource)
        if error is None:
            if not self.sync_register:
                # Kubelet <= 1.25: answer at once, dial later, and trust RegisterRequest.options.
                self._record(request, sent_options, None, serving)
                if self._manager.task_group is not None:
                    self._manager.task_group.start_soon(self._connect_later, resource, path, sent_options)
                return pb.Empty()
            try:
                # Kubelet >= 1.26: dial back and ask GetDevicePluginOptions before answering.
                await self._manager.connect(resource, path, options=None, dial_timeout=self.dial_timeout)
            except ConnectError as exc:
                error = str(exc)
            else:
                self._record(request, sent_options, None, serving)
                log.info("registered", resource=resource, endpoint=path)
                return pb.Empty()
        self._record(request, sent_options, error, serving)
        log.info("registration_rejected", resource=resource, endpoint=request.endpoint, error=error)
        # A Go handler returning a plain error: the plugin sees status UNKNOWN with the text.
        await context.abort(grpc.StatusCode.UNKNOWN, error)

    async def _connect_later(self, resource: str, path: str, options: PluginOptions) -> None:
        try:
            await self._manager.connect(resource, path, options=options, dial_timeout=self.dial_timeout)
        except ConnectError as exc:
            log.info("plugin_connect_failed", resource=resource, endpoint=path, error=str(exc))
        else:
            log.info("registered", resource=resource, endpoint=path)

    def _record(
        self, request: pb.RegisterRequest, options: PluginOptions, error: str | None, serving: bool
    ) -> None:
        self._manager.record(
            Registration(
                resource=request.resource_name,
                endpoint=request.endpoint,
                version=request.version,
                options=options,
                accepted=error is None,
                error=error,
                via="register",
                serving_at_register=serving,
            )
        )


def _leave_dead_socket(path: Path) -> None:
    # What a killed server leaves: a socket file nobody listens on (gRPC removes its own at
    # shutdown, so one is bound and closed in its place).
    if path.exists() or path.is_symlink():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        try:
            dead.bind(str(path))
        except OSError as exc:  # the directory went meanwhile
            log.debug("dead_socket_not_left", socket=str(path), error=str(exc))


def _accepts_connections(path: str) -> bool:
    """Whether something listens on the unix socket ``path`` right now (no waiting, no retry)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        # Non-blocking: a unix connect completes or is refused at once; a full backlog
        # (EAGAIN) still means a listener is there.
        probe.setblocking(False)
        try:
            probe.connect(path)
        except BlockingIOError:
            return True
        except OSError:  # missing, not a socket, nobody listening, path too long
            return False
    return True


def _remove_sockets(directory: Path) -> None:
    # What a starting kubelet does to its socket directory: every socket goes, except its
    # checkpoint; directories, regular files and symlinks stay.
    for entry in directory.iterdir():
        if entry.name == CHECKPOINT:
            continue
        try:
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
                log.debug("socket_removed", socket=str(entry))
        except FileNotFoundError:
            continue
