"""One DRA driver process: sockets, registration, slices, claims, health, shutdown.

::

    devices listed ──► DRA socket serving (self-dialled) ──► registration socket created
                                     ▲                                │ kubelet: GetInfo (1 s),
                                     │ either socket deleted          │ then NotifyRegistrationStatus
                                     └────────── both served anew ◄───┘
    in parallel: ResourceSlices published and kept (publisher), health streams, prepares.

The DRA socket serves before the registration socket exists: the kubelet dials the endpoint as
soon as it has read GetInfo. Socket names carry the pod UID when given (an old and a new pod of
a rolling update serve side by side; kubelets >= 1.33 keep both); without it, a second instance
on the same paths is refused (a live socket is never removed).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import structlog

from devplug._dra.checkpoint import FILE_NAME, Checkpoint
from devplug._dra.claims import ClaimError, Preparer
from devplug._dra.inventory import Inventory
from devplug._dra.kube import KubeError, load_client
from devplug._dra.names import default_driver_name
from devplug._dra.publisher import SlicePublisher
from devplug._dra.servicer import (
    SUPPORTED_SERVICES,
    DraStats,
    RegistrationService,
    add_dra_services,
    add_registration_service,
    self_dial,
)
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug._runtime.feed import feed_devices
from devplug._runtime.sockets import MAX_SOCKET_PATH, SocketServer, SocketUnavailableError, make_directories
from devplug._runtime.watch import DirWatcher
from devplug._version import version
from devplug.errors import ConfigError, config_error_in
from devplug.metrics import require_prometheus

if sys.version_info < (3, 11):  # anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

    from anyio.abc import TaskGroup

    from devplug._dra.kube import Kube
    from devplug._runtime.probes import ProbeServer
    from devplug.models import Device
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

log = structlog.get_logger("devplug.dra")


class DraDriver:
    """Serves plugins as one DRA driver on one node until cancelled; see :func:`devplug.dra.serve`.

    Raises:
        ConfigError: (at construction) no node name, no plugins; (in :meth:`run`) no usable
            kubeconfig, the driver's directory cannot be created, plugins_registry is not a
            directory.
    """

    def __init__(
        self, plugins: Sequence[DevicePlugin], settings: Settings, *, kube: Kube | None = None
    ) -> None:
        if not plugins:
            raise ConfigError("a DRA driver needs at least one plugin")
        if not settings.node_name:
            raise ConfigError(
                "no node name: pass --node-name or set NODE_NAME (spec.nodeName through the downward API)"
            )
        self.settings = settings
        self.plugins = tuple(plugins)
        self.driver = settings.driver_name or default_driver_name(plugins[0].resource_name)
        self.node = settings.node_name
        self.data_dir = settings.dra_plugins_dir / self.driver
        suffix = f"-{settings.pod_uid}" if settings.pod_uid else ""
        self.dra_socket = _fitting(self.data_dir, f"dra{suffix}.sock")
        self.registration_socket = _fitting(settings.plugins_registry_dir, f"{self.driver}{suffix}-reg.sock")
        self.inventory = Inventory(self.plugins)
        # State lives below the sockets' directory: its writes do not wake the socket watcher.
        self.state_dir = self.data_dir / "state"
        self.checkpoint = Checkpoint(self.state_dir / FILE_NAME, self.driver, self.node)
        self.stats = DraStats()
        self.registered = False
        self.registration_error: str | None = None
        self.history: deque[dict[str, object]] = deque(maxlen=100)
        self._kube = kube
        self._own_kube = False
        self._preparer: Preparer | None = None
        self._probe_server: ProbeServer | None = None
        self._log = log.bind(driver=self.driver, node=self.node)
        self.publisher: SlicePublisher | None = None
        self._started = anyio.Event()
        self._reloads: Counter[str] = Counter()
        self._watcher: DirWatcher | None = None

    # -- state for probes and dumps -------------------------------------------------------------

    def readiness(self) -> tuple[bool, list[str]]:
        """Ready: the kubelet's plugins_registry exists, the kubelet accepted the registration,
        the slices are published (since the last wipe), and the checkpoint is usable."""
        reasons = []
        if not self._started.is_set():
            reasons.append("starting")
        if self._watcher is not None:
            reasons.extend(f"{p} does not exist (the kubelet creates it)" for p in self._watcher.missing)
        if self.checkpoint.error:
            reasons.append(self.checkpoint.error)
        if not self.registered:
            reasons.append(
                f"not registered: {self.registration_error}" if self.registration_error else "not registered"
            )
        why = self.publisher.not_ready_reason() if self.publisher else "slices not published yet"
        if why:
            reasons.append(why)
        return not reasons, reasons

    async def wait_started(self) -> None:
        await self._started.wait()

    @property
    def counters(self) -> dict[str, Any]:
        return {}  # the device-plugin API's per-resource counters: none here

    @property
    def reloads(self) -> Counter[str]:
        return self._reloads

    @property
    def resources(self) -> dict[str, Any]:
        return {}

    def devices(self, resource: str) -> list[Device]:
        """The devices of ``resource`` this driver publishes now."""
        return [e.device for e in self.inventory.current.entries if e.resource == resource]

    def debug_state(self) -> dict[str, Any]:
        """What ``/debug/state`` and SIGUSR1 show: readiness, the slices, the prepared claims."""
        ready, reasons = self.readiness()
        publisher = self.publisher
        return {
            "ready": ready,
            "not_ready": reasons,
            "api": "dra",
            "driver": self.driver,
            "node": self.node,
            "dra_socket": str(self.dra_socket),
            "registration_socket": str(self.registration_socket),
            "registered": self.registered,
            "devices": [
                {"name": e.name, "id": e.device.id, "resource": e.resource, "health": e.device.health.value}
                for e in self.inventory.current.entries
            ],
            "slices": {
                "in_sync": publisher.in_sync if publisher else False,
                "count": publisher.slices if publisher else 0,
                "taints_supported": publisher.taints_supported if publisher else None,
                "counters_supported": publisher.counters_supported if publisher else None,
                "last_error": publisher.last_error if publisher else None,
            },
            "prepared_claims": sorted(
                f"{c.namespace}/{c.name} ({uid})" for uid, c in self.checkpoint.claims.items()
            ),
            "checkpoint_error": self.checkpoint.error,
            "events": list(self.history),
        }

    # -- running --------------------------------------------------------------------------------

    async def run(self) -> None:
        """:meth:`open`, then :meth:`serve` until cancelled."""
        await self.open()
        await self.serve()

    async def open(self) -> None:
        """Everything that can fail for a configuration reason, before anything is served.

        Raises:
            ConfigError: the driver's directory cannot be created, plugins_registry is not a
                directory, no usable kubeconfig, a metrics address that cannot be bound.
        """
        # The driver's own directory (with its state) is created; plugins_registry is the
        # kubelet's, created by its plugin watcher at start, and only waited for.
        try:
            make_directories(self.state_dir)
        except OSError as exc:
            raise ConfigError(f"cannot create the directory {self.state_dir}: {exc.strerror}") from None
        registry = self.settings.plugins_registry_dir
        if registry.exists() and not registry.is_dir():
            raise ConfigError(f"{registry} exists and is not a directory")
        kube = self._kube or load_client(self.settings.kubeconfig)
        self._own_kube = self._kube is None
        self._kube = kube
        await anyio.to_thread.run_sync(self.checkpoint.load)
        if self.checkpoint.error:
            self._log.error("checkpoint_unusable", error=self.checkpoint.error)
        self.publisher = SlicePublisher(
            kube, driver=self.driver, node=self.node, inventory=self.inventory, log=self._log
        )
        self._preparer = Preparer(
            driver=self.driver,
            node=self.node,
            inventory=self.inventory,
            checkpoint=self.checkpoint,
            cdi_dir=self.settings.cdi_dir,
            fetch_claim=_claim_reader(kube, self.publisher.errors),
            log=self._log,
            lock_file=self.state_dir / "serialize.lock" if self.settings.pod_uid else None,
            host_path_check=self.settings.host_path_check,
            host_root=self.settings.host_root,
        )
        self._probe_server = await self._probes()

    async def serve(self) -> None:
        """Serve until cancelled (after :meth:`open`)."""
        assert self.publisher is not None, "open() first"
        assert self._preparer is not None, "open() first"
        assert self._kube is not None, "open() first"
        kube, preparer, probes = self._kube, self._preparer, self._probe_server
        watcher = self._watcher = DirWatcher(self.data_dir, self.settings.plugins_registry_dir)
        try:
            async with anyio.create_task_group() as tg:
                if probes is not None:
                    tg.start_soon(probes.serve)
                await tg.start(watcher.run)
                for index, plugin in enumerate(self.plugins):
                    tg.start_soon(self._feed, index, plugin)
                tg.start_soon(self.publisher.run)
                self._log.info(
                    "started",
                    version=version(),
                    dra_socket=str(self.dra_socket),
                    services=list(SUPPORTED_SERVICES),
                )
                if not self.inventory.current.complete:
                    self._log.info("waiting_for_devices")
                await self.inventory.newer_than(0)
                while not self.inventory.current.complete:
                    await self.inventory.newer_than(self.inventory.current.version)
                await self._serve(tg, watcher, preparer)
        except BaseExceptionGroup as group:
            error = config_error_in(group)
            if error is None:
                raise
            raise error from None
        finally:
            with anyio.CancelScope(shield=True):
                if probes is not None:
                    await probes.aclose()
                if self._own_kube:
                    with contextlib.suppress(Exception):
                        await kube.aclose()

    async def _probes(self) -> ProbeServer | None:
        address = self.settings.metrics_address
        if not address:
            return None
        require_prometheus()
        from devplug._dra.metrics import DraCollector
        from devplug._runtime.probes import ProbeServer

        probes = ProbeServer(self, address, [DraCollector(self)])
        await probes.bind()
        return probes

    async def _feed(self, index: int, plugin: DevicePlugin) -> None:
        plog = self._log.bind(resource=plugin.resource_name)

        async def publish(devices: tuple[Device, ...]) -> int:
            try:
                if self.inventory.update(index, devices):
                    snapshot = self.inventory.current
                    plog.info(
                        "devices_changed",
                        version=snapshot.version,
                        devices=len(devices),
                        healthy=sum(d.healthy for d in devices),
                    )
            except ValueError as exc:
                plog.error("invalid_device_list", error=str(exc))
            return len(self.inventory.parts[index].current.devices)

        await feed_devices(plugin, publish, plog)

    async def _serve(self, tg: TaskGroup, watcher: DirWatcher, preparer: Preparer) -> None:
        while True:
            for directory in watcher.paths:  # the kubelet's plugins_registry may not be there yet
                await watcher.wait_present(directory)
            try:
                async with self._sockets(preparer) as (dra, registration):
                    self._started.set()
                    await watcher.wait_for(lambda: None if dra.alive() and registration.alive() else True)
            except SocketUnavailableError as exc:
                self.registration_error = str(exc)
                self._log.error("serve_failed", error=str(exc))
                await anyio.sleep(1.0)
                continue
            self._record("socket_deleted")
            self._log.warning("socket_deleted", note="serving both sockets anew")

    @contextlib.asynccontextmanager
    async def _sockets(self, preparer: Preparer) -> AsyncIterator[tuple[SocketServer, SocketServer]]:
        dra = SocketServer(
            self.dra_socket,
            lambda s: add_dra_services(
                s, preparer, self.inventory, node=self.node, stats=self.stats, log=self._log
            ),
            check=lambda p: self_dial(str(p)),
        )
        service = RegistrationService(self.driver, str(self.dra_socket.absolute()), self._notified)
        registration = SocketServer(
            self.registration_socket, lambda s: add_registration_service(s, service), check=_get_info
        )
        self.registered = False
        try:
            await dra.start()  # the endpoint answers before the kubelet can learn of it
            await registration.start()
            self._log.info(
                "serving", dra_socket=str(self.dra_socket), registration_socket=str(self.registration_socket)
            )
            yield dra, registration
        finally:
            self.registered = False
            with anyio.CancelScope(shield=True):
                await registration.stop(self.settings.shutdown_grace)
                await dra.stop(self.settings.shutdown_grace)
            self._log.info("stopped")

    def _notified(self, registered: bool, error: str) -> None:
        self.registered = registered
        self.registration_error = error or None
        self._record("registered" if registered else "registration_rejected", error=error)
        if registered:
            self._log.info("registered", via="plugin_watcher")
        else:
            self._log.error("registration_rejected", error=error)

    def _record(self, event: str, **fields: object) -> None:
        self.history.append({"at": time.time(), "event": event, **fields})


def _fitting(directory: Path, name: str) -> Path:
    """``directory/name``, or a hashed name when that path is too long for a unix socket."""
    path = directory / name
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    return directory / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.sock"


async def _get_info(path: Path) -> None:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub: Any = reg_pb_grpc.RegistrationStub(channel)
        await stub.GetInfo(reg_pb.InfoRequest(), timeout=2.0)


def _claim_reader(kube: Kube, errors: Counter[str]) -> Any:
    async def read(namespace: str, name: str) -> dict[str, Any]:
        try:
            return await kube.claim(namespace, name)
        except KubeError as exc:
            errors[exc.status_label] += 1
            log.warning(
                "api_error",
                verb="get",
                object=f"resourceclaims/{namespace}/{name}",
                status=exc.status_label,
                error=str(exc),
            )
            if exc.status == 404:
                raise ClaimError(f"claim {namespace}/{name} not found") from None
            raise ClaimError(f"claim {namespace}/{name} cannot be read: {exc.status_label} {exc}") from None

    return read
