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
on the same paths is refused at start, before it writes anything to the API server: each
instance holds a lock named after its DRA socket for as long as it runs, and a socket that
answers is another instance's (a dead one is a crashed predecessor's, and replaced).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import structlog

from devplug._dra.checkpoint import FILE_NAME, Checkpoint
from devplug._dra.claim_status import StatusWriter
from devplug._dra.claim_watch import follow_claims
from devplug._dra.claims import ClaimError, MetadataOptions, Preparer
from devplug._dra.inventory import Inventory
from devplug._dra.kube import KubeError, load_client
from devplug._dra.lock import hold_exclusive
from devplug._dra.metadata import default_host_dir
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
from devplug._grpc_calls import await_call
from devplug._hooks import hook_problem
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug._runtime.feed import feed_devices
from devplug._runtime.host import Host, Readiness, Reload, retry_forever
from devplug._runtime.ledger import Ledger
from devplug._runtime.podresources import follow_pods
from devplug._runtime.sockets import (
    MAX_SOCKET_PATH,
    SocketServer,
    SocketUnavailableError,
    is_live_socket,
    make_directories,
    unwritable,
)
from devplug._settings_groups import fields_of
from devplug._text import os_error_text
from devplug.errors import ConfigError

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import AsyncIterator, Iterable, Sequence
    from pathlib import Path

    from anyio.abc import TaskGroup, TaskStatus
    from prometheus_client.registry import Collector

    from devplug._dra.inventory import Entry
    from devplug._dra.kube import Kube
    from devplug.models import Device
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

log = structlog.get_logger("devplug.dra")

FIXED_SETTINGS: tuple[str, ...] = (*fields_of("dra"), *fields_of("kubelet"), *fields_of("cdi"))
"""Bound when the driver starts: its name, node, sockets, API server and where its prepared
claims' CDI specs are; a reload that changes one is refused."""


class DraService:
    """Serves plugins as one DRA driver on one node, on a :class:`Host`.

    Raises:
        ConfigError: (at construction) no node name, no plugins, a hook that cannot work as
            written; (in :meth:`open`) no usable kubeconfig, the driver's directory cannot be
            created, a socket directory this process may not write to, plugins_registry is not
            a directory, another instance of the driver on the same sockets.
    """

    fixed_settings = FIXED_SETTINGS

    def __init__(
        self,
        plugins: Sequence[DevicePlugin],
        settings: Settings,
        *,
        kube: Kube | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        if not plugins:
            raise ConfigError("a DRA driver needs at least one plugin")
        _check_hooks(plugins)
        if not settings.node_name:
            raise ConfigError(
                "no node name: pass --node-name or set NODE_NAME (spec.nodeName through the downward API)"
            )
        self.settings = settings
        self.driver = settings.driver_name or default_driver_name(plugins[0].resource_name)
        self.node = settings.node_name
        self.data_dir = settings.dra_plugins_dir / self.driver
        suffix = f"-{settings.pod_uid}" if settings.pod_uid else ""
        self.dra_socket = _fitting(self.data_dir, f"dra{suffix}.sock")
        self.registration_socket = _fitting(settings.plugins_registry_dir, f"{self.driver}{suffix}-reg.sock")
        self.inventory = Inventory(plugins)
        # State lives below the sockets' directory: its writes do not wake the socket watcher.
        self.state_dir = self.data_dir / "state"
        self.checkpoint = Checkpoint(self.state_dir / FILE_NAME, self.driver, self.node)
        self.stats = DraStats()
        self.registered = False
        self.registration_error: str | None = None
        self.publisher: SlicePublisher | None = None
        self.status_writer: StatusWriter | None = None
        """Writes the claims' ``status.devices`` entries that prepared devices report."""
        self.ledger = ledger
        """Both APIs (or the migration mode): who holds which device through either API."""
        self._kube = kube
        self._own_kube = False
        self._preparer: Preparer | None = None
        self._log = log.bind(driver=self.driver, node=self.node)
        self._host: Host | None = None
        self._tg: TaskGroup | None = None
        self._feeds: list[anyio.CancelScope] = []
        self._instance_lock: int | None = None

    @property
    def plugins(self) -> tuple[DevicePlugin, ...]:
        """The plugins served, one per resource."""
        return self.inventory.plugins

    def devices(self, resource: str) -> list[Device]:
        """The devices of ``resource`` this driver publishes now."""
        return [e.device for e in self.inventory.current.entries if e.resource == resource]

    # -- the Service interface ------------------------------------------------------------------

    def directories(self) -> list[Path]:
        return [self.data_dir, self.settings.plugins_registry_dir]

    def directory_found(self, directory: Path) -> None:
        # The driver's own directory is created private; plugins_registry is the kubelet's, and
        # this process must be able to create its registration socket there.
        refusal = unwritable(directory)
        if refusal is not None:
            raise ConfigError(refusal)

    def started_fields(self) -> dict[str, object]:
        return {"dra_socket": str(self.dra_socket), "services": list(SUPPORTED_SERVICES)}

    def readiness(self) -> list[str]:
        """Ready: the kubelet accepted the registration, the slices are published (since the
        last wipe), and the checkpoint is usable."""
        reasons = []
        if self.checkpoint.error:
            reasons.append(self.checkpoint.error)
        if self.ledger is not None and not self.ledger.ready:
            reasons.append(_unknown_holders(self.ledger))
        if not self.registered:
            reasons.append(
                f"not registered: {self.registration_error}" if self.registration_error else "not registered"
            )
        why = self.publisher.not_ready_reason() if self.publisher else "slices not published yet"
        if why:
            reasons.append(why)
        return reasons

    def state(self) -> dict[str, Any]:
        """Its part of ``/debug/state``: the sockets, the devices, the slices, the prepared claims."""
        publisher = self.publisher
        return {
            "api": "dra",
            "driver": self.driver,
            "node": self.node,
            "dra_socket": str(self.dra_socket),
            "registration_socket": str(self.registration_socket),
            "registered": self.registered,
            "devices": [self._device_state(e) for e in self.inventory.current.entries],
            "slices": {
                "in_sync": publisher.in_sync if publisher else False,
                "count": publisher.slices if publisher else 0,
                "taints_supported": publisher.taints_supported if publisher else None,
                "counters_supported": publisher.counters_supported if publisher else None,
                "shares_supported": publisher.shares_supported if publisher else None,
                "bindings_supported": publisher.bindings_supported if publisher else None,
                "partition_types_supported": publisher.partition_types_supported if publisher else None,
                "lists_supported": publisher.lists_supported if publisher else None,
                "last_error": publisher.last_error if publisher else None,
            },
            "claim_status": {
                "pending": self.status_writer.pending() if self.status_writer else 0,
                "writes": self.status_writer.writes if self.status_writer else 0,
                "errors": self.status_writer.errors if self.status_writer else 0,
            },
            "prepared_claims": sorted(
                f"{c.namespace}/{c.name} ({uid})" for uid, c in self.checkpoint.claims.items()
            ),
            "checkpoint_error": self.checkpoint.error,
            **({"ledger": self.ledger.state()} if self.ledger is not None else {}),
        }

    def _device_state(self, entry: Entry) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": entry.name,
            "id": entry.device.id,
            "resource": entry.resource,
            "health": entry.device.health.value,
        }
        if self.ledger is not None:
            holder = self.ledger.holder(entry.resource, entry.device.id)
            out["holder"] = None if holder is None else {"api": holder.api, "by": holder.holder}
        return out

    def collectors(self) -> list[Collector]:
        from devplug._dra.metrics import DraCollector

        return [DraCollector(self)]

    async def open(self) -> None:
        """Everything that can fail for a configuration reason, before anything is served.

        Raises:
            ConfigError: the driver's directory cannot be created, a socket directory this
                process may not write to, plugins_registry is not a directory, another
                instance of the driver serves on the same sockets, no usable kubeconfig.
        """
        # The driver's own directory (with its state) is created; plugins_registry is the
        # kubelet's, created by its plugin watcher at start, and only waited for.
        try:
            make_directories(self.state_dir)
        except OSError as exc:
            raise ConfigError(os_error_text(exc, "create the directory")) from None
        registry = self.settings.plugins_registry_dir
        if registry.exists() and not registry.is_dir():
            raise ConfigError(f"{registry} exists and is not a directory")
        for directory in (self.data_dir, registry):
            refusal = unwritable(directory)
            if refusal is not None:
                raise ConfigError(refusal)
        self._claim_sockets()
        kube = self._kube or load_client(self.settings.kubeconfig)
        self._own_kube = self._kube is None
        self._kube = kube
        await anyio.to_thread.run_sync(self.checkpoint.load)
        if self.checkpoint.error:
            self._log.error("checkpoint_unusable", error=self.checkpoint.error)
        self.publisher = SlicePublisher(
            kube,
            driver=self.driver,
            node=self.node,
            inventory=self.inventory,
            log=self._log,
            list_attributes=self.settings.list_attributes,
            ledger=self.ledger,
        )
        self.status_writer = StatusWriter(kube, self.driver, self._log)
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
            metadata=MetadataOptions(
                host_dir=default_host_dir(self.data_dir),
                versions=self.settings.device_metadata_versions,
                enabled=self.settings.device_metadata,
            ),
            status=self.status_writer,
            ledger=self.ledger,
        )
        if self.ledger is not None:
            for uid, claim in self.checkpoint.claims.items():
                names = [d.device for d in claim.devices if not d.admin_access]
                self.ledger.prepared(uid, f"{claim.namespace}/{claim.name}", names)

    def _claim_sockets(self) -> None:
        """Hold this instance's lock, or refuse to start: a second copy on the same sockets would
        publish the same slices and then fail to serve, for ever."""
        if self._instance_lock is not None:
            return
        lock = self.state_dir / f"{self.dra_socket.name}.lock"
        try:
            fd = hold_exclusive(lock)
        except OSError as exc:
            raise ConfigError(os_error_text(exc, f"open the lock file {lock}")) from None
        live = [p for p in (self.dra_socket, self.registration_socket) if is_live_socket(p)]
        if fd is None or live:
            if fd is not None:
                os.close(fd)
            where = live[0] if live else self.dra_socket
            raise ConfigError(
                f"another instance of DRA driver {self.driver} is serving on {where}: stop it first "
                "(instances of a rolling update need their own --pod-uid)"
            )
        self._instance_lock = fd

    async def close(self) -> None:
        fd, self._instance_lock = self._instance_lock, None
        if fd is not None:
            os.close(fd)
        if self._own_kube and self._kube is not None:
            with contextlib.suppress(Exception):
                await self._kube.aclose()

    async def serve(self, host: Host, *, task_status: TaskStatus[None]) -> None:
        """Publish the slices and feed the devices at once; serve both sockets once every plugin
        has listed its devices, again whenever one is deleted (after :meth:`open`)."""
        publisher, preparer, watcher = self.publisher, self._preparer, host.watcher
        assert publisher is not None, "open() first"
        assert preparer is not None, "open() first"
        assert watcher is not None, "the host watches the directories"
        self._host = host
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for index in range(len(self.inventory.plugins)):
                self._feeds.append(await tg.start(self._feed, index))
            tg.start_soon(publisher.run)
            if self.status_writer is not None:
                tg.start_soon(self.status_writer.run)
            ledger = self.ledger
            if ledger is not None:
                self._follow_holders(tg, ledger)
            if not self.inventory.current.complete:
                self._log.info("waiting_for_devices")
            await self.inventory.newer_than(0)
            while not self.inventory.current.complete:
                await self.inventory.newer_than(self.inventory.current.version)
            if ledger is not None and not ledger.ready:
                # Nothing is served before the holders of both APIs are known (a restart
                # rebuilds them from pod-resources, the checkpoint and the API server).
                self._log.info("waiting_for_holders", why=_unknown_holders(ledger))
                await ledger.changes.wait_for(lambda _: True if ledger.ready else None)
                self._log.info("holders_known", **ledger.counts())
            started = [task_status]

            async def serve_sockets() -> None:
                for directory in watcher.paths:  # the kubelet's plugins_registry may not be there yet
                    await watcher.wait_present(directory)
                async with self._sockets(preparer) as (dra, registration):
                    if started:
                        started.pop().started()
                    await watcher.wait_for(lambda: None if dra.alive() and registration.alive() else True)
                host.record("socket_deleted")
                self._log.warning("socket_deleted", note="serving both sockets anew")

            def failed(exc: Exception, delay: float) -> None:
                self.registration_error = str(exc)
                self._log.error("serve_failed", error=str(exc), retry_in=round(delay, 3))

            await retry_forever(serve_sockets, failed, errors=(SocketUnavailableError,), maximum=5.0)

    async def reload(
        self, old: Settings, new: Settings, plugins: Sequence[DevicePlugin]
    ) -> dict[str, list[str]]:
        """Replace the plugin objects that changed (their devices fed anew) and apply the
        host-path check settings; the set of resources is bound at start.

        Raises:
            ConfigError: the reloaded plugins serve other resources than the driver.
        """
        names = [p.resource_name for p in plugins]
        if names != [p.resource_name for p in self.inventory.plugins]:
            raise ConfigError("the resources a DRA driver serves cannot change without a restart")
        _check_hooks(plugins)
        restarted: list[str] = []
        for index, plugin in enumerate(plugins):
            if plugin is self.inventory.plugins[index]:
                continue
            self.inventory.replace(index, plugin)
            restarted.append(plugin.resource_name)
            if self._tg is not None:
                self._feeds[index].cancel()
                self._feeds[index] = await self._tg.start(self._feed, index)
        self.settings = new
        if self._preparer is not None:
            self._preparer.check_host_paths(new.host_path_check, new.host_root)
        return {"restarted": restarted, "unchanged": [n for n in names if n not in restarted]}

    # -- running --------------------------------------------------------------------------------

    def _follow_holders(self, tg: TaskGroup, ledger: Ledger) -> None:
        """Feed the ledger: the pods' devices from pod-resources and, where the device-plugin API
        is served beside, the claims allocated from this pool."""
        settings = self.settings
        tg.start_soon(
            partial(
                follow_pods,
                settings.pod_resources_socket,
                ledger,
                interval=settings.pod_resources_interval,
                log=self._log,
            )
        )
        if settings.serves_device_plugin:
            assert self._kube is not None, "open() first"
            tg.start_soon(follow_claims, self._kube, self.driver, self.node, ledger, self._log)
        else:
            ledger.claims({})  # DRA alone: no other side to withhold devices from

    def _devices_to_ledger(self) -> None:
        if self.ledger is not None:
            self.ledger.set_devices((e.name, e.resource, e.device) for e in self.inventory.current.entries)

    async def _feed(self, index: int, *, task_status: TaskStatus[anyio.CancelScope]) -> None:
        plugin = self.inventory.plugins[index]
        plog = self._log.bind(resource=plugin.resource_name)

        async def publish(devices: tuple[Device, ...]) -> int:
            try:
                if self.inventory.update(index, devices):
                    self._devices_to_ledger()
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

        with anyio.CancelScope() as scope:
            task_status.started(scope)
            await feed_devices(plugin, publish, plog)

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
        self._host_record("registered" if registered else "registration_rejected", error=error)
        if registered:
            self._log.info("registered", via="plugin_watcher")
        else:
            self._log.error("registration_rejected", error=error)

    def _host_record(self, event: str, **fields: object) -> None:
        if self._host is not None:
            self._host.record(event, **fields)


def _unknown_holders(ledger: Ledger) -> str:
    missing = []
    if not ledger.pods_read:
        missing.append("the kubelet's pod-resources API not read yet")
    if not ledger.claims_read:
        missing.append("the claims not listed yet")
    return f"waiting for the device holders: {', '.join(missing)}"


class DraDriver(Host):
    """Serves plugins as one DRA driver on one node until cancelled; see :func:`devplug.dra.serve`.

    A :class:`~devplug._runtime.host.Host` with one :class:`DraService` (``service``); its
    attributes (``driver``, ``node``, the sockets, ``inventory``, ``checkpoint``, ``publisher``,
    ``status_writer``, ``stats``, ``registered``) are the service's.

    Raises:
        ConfigError: (at construction) no node name, no plugins, a hook that cannot work as
            written; (in :meth:`open` or :meth:`run`) no usable kubeconfig, the driver's
            directory cannot be created, a socket directory this process may not write to,
            plugins_registry is not a directory, another instance of the driver on the same
            sockets, a metrics address that cannot be bound.
    """

    def __init__(
        self,
        plugins: Sequence[DevicePlugin],
        settings: Settings,
        *,
        kube: Kube | None = None,
        readiness: Iterable[Readiness] = (),
        reload: Reload | None = None,
    ) -> None:
        # --withhold-device-plugin-pods: the device-plugin pods' devices are followed too.
        ledger = Ledger() if settings.keeps_ledger else None
        self.service = DraService(plugins, settings, kube=kube, ledger=ledger)
        super().__init__([self.service], settings, readiness=readiness, reload=reload)

    @property
    def driver(self) -> str:
        """The driver's name (``gpu.example.com``)."""
        return self.service.driver

    @property
    def node(self) -> str:
        return self.service.node

    @property
    def plugins(self) -> tuple[DevicePlugin, ...]:
        return self.service.plugins

    @property
    def dra_socket(self) -> Path:
        """Where the kubelet calls the DRA service."""
        return self.service.dra_socket

    @property
    def registration_socket(self) -> Path:
        """The socket in ``plugins_registry`` the kubelet's plugin watcher finds."""
        return self.service.registration_socket

    @property
    def data_dir(self) -> Path:
        """The driver's directory (its DRA socket and ``state/``)."""
        return self.service.data_dir

    @property
    def state_dir(self) -> Path:
        return self.service.state_dir

    @property
    def inventory(self) -> Inventory:
        return self.service.inventory

    @property
    def checkpoint(self) -> Checkpoint:
        """The prepared claims, as kept on disk."""
        return self.service.checkpoint

    @property
    def publisher(self) -> SlicePublisher | None:
        """What keeps the ResourceSlices (after :meth:`open`)."""
        return self.service.publisher

    @property
    def status_writer(self) -> StatusWriter | None:
        """What writes the claims' ``status.devices`` entries (after :meth:`open`)."""
        return self.service.status_writer

    @property
    def stats(self) -> DraStats:
        return self.service.stats

    @property
    def registered(self) -> bool:
        """Whether the kubelet accepted the registration (NotifyRegistrationStatus)."""
        return self.service.registered

    def devices(self, resource: str) -> list[Device]:
        """The devices of ``resource`` this driver publishes now."""
        return self.service.devices(resource)


def _check_hooks(plugins: Sequence[DevicePlugin]) -> None:
    """Refuse a plugin whose hooks cannot work as written (ConfigError naming its class)."""
    for plugin in plugins:
        problem = hook_problem(type(plugin), "dra")
        if problem is not None:
            raise ConfigError(f"plugin {type(plugin).__name__}: {problem}")


def _fitting(directory: Path, name: str) -> Path:
    """``directory/name``, or a hashed name when that path is too long for a unix socket."""
    path = directory / name
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    return directory / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.sock"


async def _get_info(path: Path) -> None:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub: Any = reg_pb_grpc.RegistrationStub(channel)
        await await_call(stub.GetInfo(reg_pb.InfoRequest(), timeout=2.0))


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
