"""The kubelet's side of a DRA driver's sockets, for ``devplug inspect``.

:func:`detect` tells a DRA socket from a device plugin's: a registration socket answers GetInfo
with type ``DRAPlugin``; a DRA endpoint answers an empty NodePrepareResources (which every
driver must answer with an empty map). The calls themselves go through the testing kit's DRA
client (:mod:`devplug.testing._kubelet.dra_rpc`), imported only when a DRA socket was found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from devplug._proto.dra.v1 import api_pb2 as dra_v1
from devplug._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from devplug._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug.cli.inspect.client import InspectError, check_socket

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from devplug.testing._kubelet.dra_resource import ClaimRef, ClaimResult, HealthReport

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 4 * 1024 * 1024), ("grpc.enable_http_proxy", 0)]
_PROBES = (
    ("v1.DRAPlugin", dra_v1, dra_v1_grpc),
    ("v1beta1.DRAPlugin", dra_v1beta1, dra_v1beta1_grpc),
)
_NOT_DRA = (grpc.StatusCode.UNIMPLEMENTED,)


@dataclass(frozen=True)
class DraTarget:
    """A DRA socket found by :func:`detect`."""

    path: str
    """The socket given."""
    endpoint: str
    """The DRA socket the calls go to (``path`` itself unless GetInfo named another)."""
    info: dict[str, Any] | None
    """For a registration socket: GetInfo's ``type``, ``name``, ``endpoint``, ``supported_versions``."""
    services: tuple[str, ...]
    """GetInfo's ``supported_versions``, or the DRAPlugin services that answered on a bare endpoint."""


def _channel(path: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix:{path}", options=_CHANNEL_OPTIONS)


async def detect(path: str, *, timeout: float) -> DraTarget | None:
    """The DRA socket at ``path``, or ``None`` for anything else (a device plugin, or not gRPC).

    Raises:
        InspectError: a DRA registration socket whose endpoint is not there.
    """
    async with _channel(path) as channel:
        try:
            info = await reg_pb_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _NOT_DRA:
                return None  # not gRPC, hung, or broken: the device-plugin path says which
        else:
            if info.type != "DRAPlugin":
                return None
            endpoint = info.endpoint or path
            info_doc = {
                "type": info.type,
                "name": info.name,
                "endpoint": info.endpoint,
                "supported_versions": list(info.supported_versions),
            }
            if endpoint != path:
                try:
                    endpoint = check_socket(endpoint)
                except InspectError as problem:
                    raise InspectError(f"{path}: GetInfo names endpoint {problem}") from None
            return DraTarget(path, endpoint, info_doc, tuple(info.supported_versions))
        served = [
            service for service, pb, pb_grpc in _PROBES if await _answers(channel, pb, pb_grpc, timeout)
        ]
    return DraTarget(path, path, None, tuple(served)) if served else None


async def _answers(channel: grpc.aio.Channel, pb: Any, pb_grpc: Any, timeout: float) -> bool:
    try:
        await pb_grpc.DRAPluginStub(channel).NodePrepareResources(
            pb.NodePrepareResourcesRequest(), timeout=timeout
        )
    except grpc.aio.AioRpcError:
        return False
    return True


class DraConnection:
    """A channel to a DRA endpoint and the kubelet's calls on it, each with a deadline."""

    def __init__(self, endpoint: str, *, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = _channel(endpoint)

    async def close(self) -> None:
        await self._channel.close(None)

    async def prepare(self, service: str, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """NodePrepareResources on ``service``; the answer as sent, by claim UID.

        Raises:
            InspectError: the call failed.
        """
        from devplug.testing._kubelet import dra_rpc as _dra_rpc

        try:
            return await _dra_rpc.prepare(self._channel, service, claims, deadline=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise InspectError(str(_dra_rpc.rpc_error("NodePrepareResources", exc))) from None

    async def unprepare(self, service: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources on ``service``; each answered claim UID and its error.

        Raises:
            InspectError: the call failed.
        """
        from devplug.testing._kubelet import dra_rpc as _dra_rpc

        try:
            return await _dra_rpc.unprepare(self._channel, service, claims, deadline=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise InspectError(str(_dra_rpc.rpc_error("NodeUnprepareResources", exc))) from None

    async def health(self, service: str) -> AsyncIterator[tuple[HealthReport, ...]]:
        """NodeWatchResources on ``service``: every message until the stream ends.

        Raises:
            InspectError: the stream failed, or the driver ended it.
        """
        from devplug.testing._kubelet import dra_rpc as _dra_rpc

        try:
            async for reports in _dra_rpc.watch_health(self._channel, service):
                yield reports
        except grpc.aio.AioRpcError as exc:
            status = f"{exc.code().name}: {(exc.details() or 'no details').splitlines()[0]}"
            raise InspectError(f"{self.endpoint}: NodeWatchResources ({service}) failed: {status}") from None
        raise InspectError(
            f"{self.endpoint}: the driver ended NodeWatchResources (the kubelet drops its health "
            "and reopens the stream 5 s later)"
        )
