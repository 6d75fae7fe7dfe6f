"""The kubelet's side of a DRA driver's sockets, for ``devplug inspect``.

:func:`detect` tells a DRA socket from a device plugin's: a registration socket answers GetInfo
with type ``DRAPlugin``; a DRA endpoint answers an empty NodePrepareResources (which every
driver must answer with an empty map). Every call goes through the fake kubelet's clients
(:mod:`devplug.testing._kubelet.rpc`, :mod:`devplug.testing._kubelet.dra_rpc`), imported when a
socket is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc

from devplug.cli.inspect.client import InspectError, check_socket, status

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence

    from devplug.models import ClaimRef
    from devplug.testing._kubelet.dra_resource import ClaimResult, HealthReport

T = TypeVar("T")
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


async def detect(path: str, *, timeout: float) -> DraTarget | None:
    """The DRA socket at ``path``, or ``None`` for anything else (a device plugin, or not gRPC).

    Raises:
        InspectError: a DRA registration socket whose endpoint is not there.
    """
    from devplug.testing._kubelet.dra_validation import DRA_SERVICES
    from devplug.testing._kubelet.rpc import RegistrationInfoClient, open_channel

    async with open_channel(path) as channel:
        try:
            info = await RegistrationInfoClient(channel).get_info(deadline=timeout)
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
        served = [service for service in DRA_SERVICES if await _answers(channel, service, timeout)]
    return DraTarget(path, path, None, tuple(served)) if served else None


async def _answers(channel: grpc.aio.Channel, service: str, timeout: float) -> bool:
    from devplug.testing._kubelet import dra_rpc

    try:
        await dra_rpc.prepare(channel, service, (), deadline=timeout)
    except grpc.aio.AioRpcError:
        return False
    return True


class DraConnection:
    """A channel to a DRA endpoint and the kubelet's calls on it, each with a deadline."""

    def __init__(self, endpoint: str, *, timeout: float) -> None:
        from devplug.testing._kubelet.rpc import open_channel

        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = open_channel(endpoint)

    async def close(self) -> None:
        await self._channel.close(None)

    async def prepare(self, service: str, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """NodePrepareResources on ``service``; the answer as sent, by claim UID.

        Raises:
            InspectError: the call failed.
        """
        from devplug.testing._kubelet import dra_rpc

        call = dra_rpc.prepare(self._channel, service, claims, deadline=self.timeout)
        return await _call("NodePrepareResources", call)

    async def unprepare(self, service: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources on ``service``; each answered claim UID and its error.

        Raises:
            InspectError: the call failed.
        """
        from devplug.testing._kubelet import dra_rpc

        call = dra_rpc.unprepare(self._channel, service, claims, deadline=self.timeout)
        return await _call("NodeUnprepareResources", call)

    async def served_health(self, services: Sequence[str]) -> str:
        """The first of ``services`` (DRAResourceHealth versions, newest first) the endpoint serves.

        Nothing advertises what a bare DRA endpoint serves: a stream is opened on each in turn
        until one does not answer UNIMPLEMENTED (a served one answers with a message, or says
        nothing until the deadline), and closed again. The last is taken without asking.
        """
        import anyio

        from devplug.testing._kubelet import dra_rpc

        for service in services[:-1]:
            # An async generator: closing it cancels the call.
            stream = cast("AsyncGenerator[object, None]", dra_rpc.watch_health(self._channel, service))
            try:
                with anyio.move_on_after(self.timeout):
                    await anext(stream, None)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    continue
            finally:
                await stream.aclose()
            return service  # served; a stream that fails otherwise says so once it is watched
        return services[-1]

    async def health(self, service: str) -> AsyncIterator[tuple[HealthReport, ...]]:
        """NodeWatchResources on ``service``: every message until the stream ends.

        Raises:
            InspectError: the stream failed, or the driver ended it.
        """
        from devplug.testing._kubelet import dra_rpc

        try:
            async for reports in dra_rpc.watch_health(self._channel, service):
                yield reports
        except grpc.aio.AioRpcError as exc:
            raise InspectError(
                f"{self.endpoint}: NodeWatchResources ({service}) failed: {status(exc)}"
            ) from None
        raise InspectError(
            f"{self.endpoint}: the driver ended NodeWatchResources (the kubelet drops its health "
            "and reopens the stream 5 s later)"
        )


async def _call(method: str, call: Awaitable[T]) -> T:
    """``call``'s answer; its failure in the kubelet's words."""
    from devplug.testing._kubelet import dra_rpc

    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise InspectError(str(dra_rpc.rpc_error(method, exc))) from None
