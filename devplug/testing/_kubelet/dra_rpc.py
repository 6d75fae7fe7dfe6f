"""The fake kubelet's DRA gRPC plumbing: typed calls on a driver's DRA socket.

Like :mod:`devplug.testing._kubelet.rpc` for device plugins, this is the only DRA module of the kit
that touches the generated code; the rest sees plain records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from devplug._grpc_calls import await_call
from devplug._proto.dra.v1 import api_pb2 as dra_v1
from devplug._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from devplug._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from devplug._proto.drahealth.v1 import api_pb2 as health_v1
from devplug._proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug.errors import KubeletError
from devplug.testing._kubelet import rpc
from devplug.testing._kubelet.dra_resource import ClaimDevice, ClaimResult, HealthReport
from devplug.testing._kubelet.dra_validation import HEALTH_V1
from devplug.testing._kubelet.validation import go_rpc_error

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from types import ModuleType

    import grpc

    from devplug.testing._kubelet.dra_resource import ClaimLike, HealthName

_MODULES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1, dra_v1_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc),
}
_HEALTH: dict[int, HealthName] = {1: "Healthy", 2: "Unhealthy"}

# gRPC-Go's reconnect back-off, which the kubelet keeps: from 1 s growing to 120 s (its other
# defaults are every channel's, see rpc.open_channel).
_RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 120_000),
)


def open_channel(endpoint: str) -> grpc.aio.Channel:
    """A channel to ``unix:<endpoint>`` (kubelet >= 1.34 prepends ``unix:`` itself); connects lazily."""
    return rpc.open_channel(endpoint, *_RECONNECT)


def rpc_error(method: str, exc: grpc.aio.AioRpcError) -> KubeletError:
    """The kubelet's text for a failed call: ``<method>: rpc error: code = ... desc = ...``."""
    code = exc.code().name
    details = exc.details() or ""
    if code == "DEADLINE_EXCEEDED" and details == "Deadline Exceeded":
        details = "context deadline exceeded"  # what Go's client reports for its own deadline
    return KubeletError(f"{method}: {go_rpc_error(code, details)}", code)


def _claims(pb: ModuleType, claims: Sequence[ClaimLike]) -> list[Any]:
    return [pb.Claim(namespace=namespace, name=name, uid=uid) for namespace, name, uid in claims]


async def prepare(
    channel: grpc.aio.Channel, service: str, claims: Sequence[ClaimLike], *, deadline: float
) -> dict[str, ClaimResult]:
    """NodePrepareResources on ``service``; every entry of the answer, unchecked.

    Raises:
        grpc.aio.AioRpcError: the call failed.
    """
    pb, pb_grpc = _MODULES[service]
    stub: Any = pb_grpc.DRAPluginStub(channel)
    request = pb.NodePrepareResourcesRequest(claims=_claims(pb, claims))
    reply = await await_call(stub.NodePrepareResources(request, timeout=deadline))
    results: dict[str, ClaimResult] = {}
    for uid, entry in reply.claims.items():
        devices = tuple(
            ClaimDevice(
                request_names=tuple(d.request_names),
                pool=d.pool_name,
                device=d.device_name,
                cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=d.share_id if service == "v1.DRAPlugin" and d.HasField("share_id") else None,
            )
            for d in entry.devices
        )
        results[uid] = ClaimResult(devices=devices, error=entry.error)
    return results


async def unprepare(
    channel: grpc.aio.Channel, service: str, claims: Sequence[ClaimLike], *, deadline: float
) -> dict[str, str]:
    """NodeUnprepareResources on ``service``; each answered claim UID and its error ("" for none).

    Raises:
        grpc.aio.AioRpcError: the call failed.
    """
    pb, pb_grpc = _MODULES[service]
    stub: Any = pb_grpc.DRAPluginStub(channel)
    request = pb.NodeUnprepareResourcesRequest(claims=_claims(pb, claims))
    reply = await await_call(stub.NodeUnprepareResources(request, timeout=deadline))
    return {uid: entry.error for uid, entry in reply.claims.items()}


async def watch_health(channel: grpc.aio.Channel, service: str) -> AsyncIterator[tuple[HealthReport, ...]]:
    """NodeWatchResources on ``service``: each message as the driver sent it, until the stream ends.

    Raises:
        grpc.aio.AioRpcError: the stream failed (or could not be opened).
    """
    if service == HEALTH_V1:
        stub: Any = health_v1_grpc.DRAResourceHealthStub(channel)
        request: Any = health_v1.NodeWatchResourcesRequest()
    else:
        stub = health_v1alpha1_grpc.DRAResourceHealthStub(channel)
        request = health_v1alpha1.NodeWatchResourcesRequest()
    call = stub.NodeWatchResources(request)
    try:
        async for message in cast("AsyncIterator[Any]", call):
            yield tuple(
                HealthReport(
                    pool=d.device.pool_name,
                    device=d.device.device_name,
                    health=_HEALTH.get(d.health, "Unknown"),
                    last_updated=d.last_updated_time,
                    timeout_seconds=d.health_check_timeout_seconds,
                    message=d.message,
                )
                for d in message.devices
            )
    finally:
        call.cancel()
