"""The DRA sockets' gRPC services: the only module of the DRA runtime that touches protobuf.

* ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and ``...v1beta1.DRAPlugin``: one set of
  handlers under both names (the messages are the same on the wire; v1 adds ``share_id``).
* ``v1alpha1.DRAResourceHealth`` and ``v1.DRAResourceHealth``: the full health list at once, on
  every change, and at least every :data:`HEALTH_RESEND` seconds (the kubelet marks a device
  Unknown after 30 s without a report).
* ``pluginregistration.Registration`` on the registration socket: GetInfo and the kubelet's
  verdict.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import grpc

from devplug._proto.dra.v1 import api_pb2 as v1
from devplug._proto.dra.v1 import api_pb2_grpc as v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as v1beta1
from devplug._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug._proto.drahealth.v1 import api_pb2 as health_v1
from devplug._proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug._runtime.telemetry import RpcStats
from devplug._text import cut_to_bytes
from devplug.models import ClaimRef, Device

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from types import ModuleType

    from devplug._dra.claims import Outcome, Preparer
    from devplug._dra.inventory import Inventory, Snapshot

SUPPORTED_SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
)
"""What GetInfo advertises, in this order: kubelets >= 1.34 use the first DRAPlugin they know, so
v1 comes first; 1.37 prefers v1 health and 1.34-1.36 open v1alpha1."""
HEALTH_RESEND = 10.0
HEALTH_TIMEOUT = 30
"""Seconds a report holds (``health_check_timeout_seconds``, kubelet >= 1.35)."""
HEALTH_MESSAGE_BYTES = 1024
"""The longest health message a kubelet keeps (``ResourceHealthMessageMaxLength``, in bytes as
Go counts them); a longer one is cut to 1021 bytes and ``...``, here, before it is sent."""
NO_REASON = "reported Unhealthy by its driver, which gave no reason"
METHODS = ("NodePrepareResources", "NodeUnprepareResources")


class DraStats:
    """Counters behind the DRA metrics: RPCs and claims."""

    def __init__(self) -> None:
        self.rpcs = {m: RpcStats() for m in METHODS}
        self.claim_errors: dict[str, int] = dict.fromkeys(METHODS, 0)
        self.claims: dict[str, int] = dict.fromkeys(METHODS, 0)
        self.health_streams = 0


class DraPluginService:
    """NodePrepareResources / NodeUnprepareResources for one wire version (``pb``: its messages)."""

    def __init__(self, preparer: Preparer, pb: ModuleType, stats: DraStats, log: Any) -> None:
        self._preparer = preparer
        self._pb = pb
        self._stats = stats
        self._log = log
        self._share_id = pb is v1

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        outcomes = await self._preparer.prepare(_refs(request), time_left=context.time_remaining())
        response = self._pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            entry.SetInParent()  # an empty success is an entry too
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                item = entry.devices.add(
                    request_names=device.requests,
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if self._share_id and device.share_id:
                    item.share_id = device.share_id
        self._count("NodePrepareResources", outcomes, started)
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        outcomes = await self._preparer.unprepare(_refs(request), time_left=context.time_remaining())
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            entry.SetInParent()
            entry.error = outcome.error
        self._count("NodeUnprepareResources", outcomes, started)
        return response

    def _count(self, method: str, outcomes: dict[str, Outcome], started: float) -> None:
        self._stats.rpcs[method].observe(time.perf_counter() - started)
        self._stats.claims[method] += len(outcomes)
        errors = sum(1 for o in outcomes.values() if o.error)
        self._stats.claim_errors[method] += errors
        if errors:
            self._stats.rpcs[method].failed("claim_error")


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


class HealthService:
    """NodeWatchResources for one wire version of DRAResourceHealth."""

    def __init__(self, inventory: Inventory, node: str, pb: ModuleType, stats: DraStats) -> None:
        self._inventory = inventory
        self._node = node
        self._pb = pb
        self._stats = stats

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self._stats.health_streams += 1
        try:
            snapshot = self._inventory.current
            while True:
                yield self._message(snapshot)
                with anyio.move_on_after(HEALTH_RESEND):
                    snapshot = await self._inventory.newer_than(snapshot.version)
                    continue
                snapshot = self._inventory.current
        finally:
            self._stats.health_streams -= 1

    def _message(self, snapshot: Snapshot) -> Any:
        pb = self._pb
        now = int(time.time())
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self._node, device_name=e.name),
                    health=pb.HealthStatus.HEALTHY if e.device.healthy else pb.HealthStatus.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT,
                    message=health_message(e.device),
                )
                for e in snapshot.entries
            ]
        )


def health_message(device: Device) -> str:
    """The ``message`` sent with ``device``'s health: its own (cut to what a kubelet keeps), or,
    for an Unhealthy device without one, :data:`NO_REASON`."""
    # Cut here on a character boundary: the kubelet would cut inside one.
    return cut_to_bytes(device.health_message or ("" if device.healthy else NO_REASON), HEALTH_MESSAGE_BYTES)


class RegistrationService(reg_pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """``pluginregistration.Registration`` for the kubelet's plugin watcher (type DRAPlugin)."""

    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool, str], None]) -> None:
        self._info = reg_pb.PluginInfo(
            type="DRAPlugin", name=driver, endpoint=endpoint, supported_versions=list(SUPPORTED_SERVICES)
        )
        self._on_status = on_status

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return self._info  # the kubelet waits one second for this

    async def NotifyRegistrationStatus(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        self._on_status(request.plugin_registered, request.error)
        return reg_pb.RegistrationStatusResponse()


def add_dra_services(
    server: grpc.aio.Server, preparer: Preparer, inventory: Inventory, *, node: str, stats: DraStats, log: Any
) -> None:
    """Both DRAPlugin versions and both health versions, on the DRA endpoint."""
    v1_grpc.add_DRAPluginServicer_to_server(DraPluginService(preparer, v1, stats, log), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DraPluginService(preparer, v1beta1, stats, log), server)
    health_v1_grpc.add_DRAResourceHealthServicer_to_server(
        HealthService(inventory, node, health_v1, stats), server
    )
    health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
        HealthService(inventory, node, health_v1alpha1, stats), server
    )


def add_registration_service(server: grpc.aio.Server, service: RegistrationService) -> None:
    reg_pb_grpc.add_RegistrationServicer_to_server(service, server)


async def self_dial(path: str) -> None:
    """Connect to ``path`` as the kubelet will (HTTP/2 over the unix socket), calling nothing:
    the RPC counters count the kubelet's calls only."""
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        with anyio.fail_after(2.0):
            await channel.channel_ready()
