"""The DevicePlugin and plugin-watcher Registration services of one resource.

Converts protobuf to models and back, and guards every author hook: an exception becomes a
gRPC status with the message (INTERNAL), is logged with the request, and never ends the process.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import grpc

from devplug import _convert
from devplug._device_plugin.telemetry import ResourceCounters
from devplug._hooks import advertised_options
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug.checks import HostPathError, check_host_paths

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
    from pathlib import Path

    from devplug._runtime.ledger import Ledger
    from devplug._runtime.state import DeviceState, Snapshot
    from devplug.checks import CheckMode
    from devplug.models import Device
    from devplug.plugin import DevicePlugin

# The kubelet's default maximum received message size: a larger ListAndWatch message is
# dropped on its side, so devplug refuses to send it and says why.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
API_VERSION = "v1beta1"
_NAMED_IDS = 10  # unknown IDs named in an error; the rest are counted

Req = TypeVar("Req")
Resp = TypeVar("Resp")
if TYPE_CHECKING:
    Handler = Callable[["DevicePluginService", Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]


def _measured(method: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Count the calls of a unary RPC, its errors by status code, and its latency.

    The hot path's whole cost: two clock reads, a dict lookup, an addition and a bisect.
    """
    name = method.__name__

    @functools.wraps(method)
    async def measured(
        self: DevicePluginService, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Resp:
        stats = self._rpcs[name]
        started = time.perf_counter()
        try:
            return await method(self, request, context)
        except BaseException as exc:
            stats.failed(_status_of(exc, context))
            raise
        finally:
            stats.observe(time.perf_counter() - started)

    return measured


def _status_of(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The status code an RPC that raised ``exc`` ends with, by name."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "CANCELLED"
    # context.abort() has set the code; anything else reaches the client as UNKNOWN.
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


@dataclass
class ServiceStats:
    """What the kubelet side has been given; read by readiness checks, metrics and debug dumps."""

    streams: int = 0
    """ListAndWatch streams open now."""
    lists_sent: int = 0
    last_sent_at: float | None = None
    """time.monotonic() of the last ListAndWatch message sent."""
    watcher_status: tuple[bool, str] | None = None
    """The last NotifyRegistrationStatus (plugin_registered, error) in plugin-watcher mode."""
    oversized_versions: set[int] = field(default_factory=set)


class DevicePluginService(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """``v1beta1.DevicePlugin`` for one plugin and its device state."""

    def __init__(
        self,
        plugin: DevicePlugin,
        state: DeviceState,
        log: Any,
        *,
        host_path_check: CheckMode = "warn",
        host_root: Path | str = "/",
        counters: ResourceCounters | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self._plugin = plugin
        self._state = state
        self._ledger = ledger
        self._log = log
        self._host_path_check: CheckMode = host_path_check
        self._host_root = host_root
        self._resource = plugin.resource_name
        self._options = _convert.options_to_pb(advertised_options(type(plugin)))
        self._message_cache: tuple[int, pb.ListAndWatchResponse | None] = (-1, None)
        self._waits: set[anyio.CancelScope] = set()
        self._closed = False
        self.stats = ServiceStats()
        self.counters = counters if counters is not None else ResourceCounters(plugin.resource_name)
        self._rpcs = self.counters.rpcs

    def close_streams(self) -> None:
        """End every ListAndWatch stream now (they never end by themselves), and any new one."""
        self._closed = True
        for scope in self._waits:
            scope.cancel()

    @_measured
    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DevicePluginOptions:
        # Kubelet >= 1.26 calls this while Register is in flight: answer from a constant.
        return self._options

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        stats = self.stats
        counters = self.counters
        counters.rpcs["ListAndWatch"].requests += 1
        stats.streams += 1
        log = self._log.bind(peer=context.peer())
        log.info("stream_opened")
        version = 0
        try:
            while not self._closed:
                # The current list at once (version 0 means the plugin has not listed yet),
                # then each newer version; a burst collapses into its latest snapshot.
                with anyio.CancelScope() as wait:
                    self._waits.add(wait)
                    try:
                        snapshot = await self._state.newer_than(version)
                    finally:
                        self._waits.discard(wait)
                if wait.cancelled_caught:
                    break
                version = snapshot.version
                message = self._message(snapshot)
                if message is None:
                    continue
                # Counted as it is handed to the stream: the generator resumes only when gRPC
                # asks for the next message, which may be after the kubelet has read this one,
                # and the figures must never lag behind what the kubelet has.
                stats.lists_sent += 1
                stats.last_sent_at = now = time.monotonic()
                counters.sent(snapshot, now)
                log.debug("devices_sent", version=version, devices=len(snapshot.devices))
                yield message
        finally:
            stats.streams -= 1
            log.info("stream_closed", last_version=version)

    def _message(self, snapshot: Snapshot) -> pb.ListAndWatchResponse | None:
        cached_version, cached = self._message_cache
        if cached_version == snapshot.version:
            return cached
        message: pb.ListAndWatchResponse | None = _convert.list_response(snapshot.devices)
        size = message.ByteSize() if message is not None else 0
        if size > MAX_MESSAGE_BYTES:
            if snapshot.version not in self.stats.oversized_versions:
                self.stats.oversized_versions.add(snapshot.version)
                self._log.error(
                    "device_list_too_large",
                    devices=len(snapshot.devices),
                    bytes=size,
                    limit=MAX_MESSAGE_BYTES,
                    version=snapshot.version,
                )
            message = None
        self._message_cache = (snapshot.version, message)
        return message

    @_measured
    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreferredAllocationResponse:
        by_id = self._state.current.by_id
        responses = []
        for creq in request.container_requests:
            available = list(creq.available_deviceIDs)
            must_include = list(creq.must_include_deviceIDs)
            size = creq.allocation_size
            responses.append(
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=await self._prefer(by_id, available, must_include, size)
                )
            )
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def _prefer(
        self, by_id: dict[str, Device], available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        # Never fail: an admission storm calls this back to back and an error fails the pod.
        # (The policies module loads with the first call: a plugin without the option never
        # needs it, and a later import is a dictionary lookup.)
        from devplug import policies

        if size >= len(available):
            return policies.repair((), available, must_include, size)
        try:
            choice = await self._plugin.preferred_allocation(
                [by_id[i] for i in available if i in by_id],
                [by_id[i] for i in must_include if i in by_id],
                size,
            )
        except Exception as exc:
            self._log.exception(
                "preferred_allocation_failed",
                error=str(exc),
                available=available,
                must_include=must_include,
                size=size,
            )
            choice = None
        if isinstance(choice, str):  # a bare ID would be iterated character by character
            choice = [choice]
        result = policies.repair(choice or (), available, must_include, size)
        if choice is not None and list(choice) != result:
            self._log.warning("preferred_allocation_repaired", returned=list(choice), sent=result)
        return result

    def _devices(self, ids: Sequence[str]) -> tuple[list[Device], list[str]]:
        by_id = self._state.current.by_id
        devices: list[Device] = []
        unknown: list[str] = []
        for i in ids:  # one pass: this runs on every Allocate
            device = by_id.get(i)
            if device is None:
                unknown.append(i)
            else:
                devices.append(device)
        return devices, unknown

    @_measured
    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AllocateResponse:
        responses = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            devices, unknown = self._devices(ids)
            if unknown:
                await self._reject(context, "allocate", ids, unknown)
            if self._ledger is not None:
                await self._held_through_dra(context, ids)
            try:
                allocation = await self._plugin.allocate(devices)
                response = _convert.allocation_to_pb(allocation)
            except Exception as exc:
                self._log.exception("allocate_failed", devices=ids, error=str(exc))
                await context.abort(grpc.StatusCode.INTERNAL, f"allocate failed for {ids}: {exc}")
            # A missing host path passes the kubelet and fails in the container runtime, far
            # from its cause: say so here, where the plugin's answer is known. (Only device
            # nodes and mounts name host paths: an answer without either has nothing to check.)
            if allocation.devices or allocation.mounts:
                try:
                    check_host_paths(
                        allocation, mode=self._host_path_check, root=self._host_root, log=self._log
                    )
                except HostPathError as exc:
                    self._log.error("allocate_refused", devices=ids, error=str(exc))
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"allocate for {ids}: {exc}")
            responses.append(response)
        return pb.AllocateResponse(container_responses=responses)

    @_measured
    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PreStartContainerResponse:
        ids = list(request.devices_ids)
        devices, unknown = self._devices(ids)
        if unknown:
            await self._reject(context, "pre_start_container", ids, unknown)
        try:
            await self._plugin.pre_start_container(devices)
        except Exception as exc:
            self._log.exception("pre_start_container_failed", devices=ids, error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"pre_start_container failed for {ids}: {exc}")
        return pb.PreStartContainerResponse()

    async def _held_through_dra(self, context: grpc.aio.ServicerContext[Any, Any], ids: list[str]) -> None:
        """Refuse devices DRA holds (the last step of a race: the stream reports them Unhealthy
        as soon as the claim is known); else record them as given, before any await, so a
        prepare that comes next sees them."""
        ledger = self._ledger
        assert ledger is not None
        for device_id in ids:
            why = ledger.from_plugin(self._resource, device_id)
            if why is not None:
                if ledger.refused("allocate", f"{self._resource}/{device_id}", why):
                    self._log.warning(
                        "allocate_refused_held", device=device_id, holder=why.holder, api=why.api
                    )
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"device {device_id} of resource {self._resource} is {why}",
                )
        ledger.allocated(self._resource, ids)

    async def _reject(
        self, context: grpc.aio.ServicerContext[Any, Any], call: str, ids: list[str], unknown: list[str]
    ) -> None:
        # Name a few, count the rest: a status message travels in HTTP/2 trailers, which a
        # client caps at 8 KiB (a longer one turns into RESOURCE_EXHAUSTED), and logs stay short.
        shown = ", ".join(unknown[:_NAMED_IDS])
        if len(unknown) > _NAMED_IDS:
            shown += f" and {len(unknown) - _NAMED_IDS} more"
        self._log.warning(f"{call}_unknown_devices", requested=len(ids), unknown=shown)
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"unknown device IDs for resource {self._resource}: {shown}"
        )


class WatcherRegistrationService(reg_pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """``pluginregistration.Registration``: who this socket is, for the kubelet's plugin watcher."""

    def __init__(
        self,
        resource: str,
        endpoint: str,
        stats: ServiceStats,
        log: Any,
        on_status: Callable[[bool, str], None],
    ) -> None:
        self._info = reg_pb.PluginInfo(
            type="DevicePlugin", name=resource, endpoint=endpoint, supported_versions=[API_VERSION]
        )
        self._stats = stats
        self._log = log
        self._on_status = on_status

    async def GetInfo(
        self, request: reg_pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb.PluginInfo:
        return self._info  # the kubelet allows one second

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb.RegistrationStatusResponse:
        self._stats.watcher_status = (request.plugin_registered, request.error)
        self._on_status(request.plugin_registered, request.error)
        if request.plugin_registered:
            self._log.info("registered", via="watcher")
        else:
            self._log.error("registration_rejected", via="watcher", error=request.error)
        return reg_pb.RegistrationStatusResponse()


def add_services(
    server: grpc.aio.Server, devices: DevicePluginService, watcher: WatcherRegistrationService | None
) -> None:
    pb_grpc.add_DevicePluginServicer_to_server(devices, server)
    if watcher is not None:
        reg_pb_grpc.add_RegistrationServicer_to_server(watcher, server)
