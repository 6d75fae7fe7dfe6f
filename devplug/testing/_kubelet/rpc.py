"""The fake kubelet's gRPC plumbing: typed clients and the Registration server.

The generated ``*_pb2_grpc`` modules are untyped; this is the only module of the testing kit
that touches them, so the rest of the kit sees typed methods and plain models. ``devplug
inspect`` talks to a plugin through the same client (:class:`PluginClient`), with a deadline on
every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import anyio
import grpc

from devplug._grpc_calls import await_call
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug.errors import KubeletError
from devplug.models import ContainerAllocation, DeviceSpec, Mount, PluginOptions

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
    from typing import TypeAlias

    RegisterHandler: TypeAlias = Callable[
        [pb.RegisterRequest, grpc.aio.ServicerContext[Any, Any]], Awaitable[pb.Empty]
    ]

# The kubelet dials without keepalive and with gRPC-Go's default 4 MiB receive limit; a
# larger ListAndWatch message fails its stream, so the fake uses the same limit.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    ("grpc.enable_http_proxy", 0),
]

RawDevice = tuple[str, str, tuple[int, ...]]
"""One device as received: (ID, health string exactly as sent, NUMA node IDs)."""


class DialError(Exception):
    """A unix socket did not accept a gRPC connection in time."""


def error_from_rpc(exc: grpc.aio.AioRpcError) -> KubeletError:
    """A ``KubeletError`` carrying the plugin's status: message = details, code = status name."""
    return KubeletError(exc.details() or "", exc.code().name)


def open_channel(path: str, *options: tuple[str, int]) -> grpc.aio.Channel:
    """A channel to the unix socket ``path`` with the kubelet's options (and ``options``); it
    connects on first use."""
    return grpc.aio.insecure_channel(f"unix:{path}", options=[*_CHANNEL_OPTIONS, *options])


async def dial(path: str, *, within: float) -> grpc.aio.Channel:
    """Open a channel to the unix socket ``path`` and wait until it is connected.

    Like the kubelet's blocking dial, a missing socket is retried for ``within`` seconds.

    Raises:
        DialError: with Go's text for an expired dial context.
    """
    channel = open_channel(path)
    try:
        with anyio.fail_after(within):
            await channel.channel_ready()
    except TimeoutError:
        with anyio.CancelScope(shield=True):
            await channel.close(None)
        raise DialError("context deadline exceeded") from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await channel.close(None)
        raise
    return channel


class PluginClient:
    """The kubelet's side of one connection to a plugin's ``v1beta1.DevicePlugin`` service.

    Args:
        deadline: seconds each call may take; None for none, as the kubelet, which makes every
            call but PreStartContainer with a background context.

    Every call raises ``grpc.aio.AioRpcError`` when it fails.
    """

    def __init__(self, channel: grpc.aio.Channel, *, deadline: float | None = None) -> None:
        self.channel = channel
        self.deadline = deadline
        self._stub: Any = pb_grpc.DevicePluginStub(channel)

    async def get_options(self) -> PluginOptions:
        reply = cast(
            "pb.DevicePluginOptions",
            await await_call(self._stub.GetDevicePluginOptions(pb.Empty(), timeout=self.deadline)),
        )
        return PluginOptions(
            pre_start_required=reply.pre_start_required,
            get_preferred_allocation_available=reply.get_preferred_allocation_available,
        )

    def list_and_watch(self) -> DeviceLists:
        """Open the ListAndWatch stream (never with a deadline: it lasts as long as the connection)."""
        return DeviceLists(self._stub.ListAndWatch(pb.Empty()))

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """One AllocateRequest with a container request per item; every container response, as sent."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in requests]
        )
        call = self._stub.Allocate(request, timeout=self.deadline)
        reply = cast("pb.AllocateResponse", await await_call(call))
        return [_allocation(r) for r in reply.container_responses]

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """GetPreferredAllocation for one container: the first container response's choice (the
        kubelet reads only that one), or None when the plugin answered no container response."""
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        reply = cast(
            "pb.PreferredAllocationResponse",
            await await_call(self._stub.GetPreferredAllocation(request, timeout=self.deadline)),
        )
        return list(reply.container_responses[0].deviceIDs) if reply.container_responses else None

    async def pre_start(self, device_ids: Sequence[str], *, deadline: float | None = None) -> None:
        """PreStartContainer with one container's device IDs; ``deadline`` overrides the client's."""
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        await await_call(
            self._stub.PreStartContainer(request, timeout=self.deadline if deadline is None else deadline)
        )

    async def close(self) -> None:
        await self.channel.close(None)


class DeviceLists:
    """One ListAndWatch stream: each message's devices as sent, until the plugin ends it.

    A read may be cancelled (a timeout) without ending the stream; :meth:`cancel` ends it.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._messages: AsyncIterator[pb.ListAndWatchResponse] = aiter(call)

    def __aiter__(self) -> DeviceLists:
        return self

    async def __anext__(self) -> list[RawDevice]:
        message = await anext(self._messages)
        return [(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in message.devices]

    def cancel(self) -> None:
        self._call.cancel()


def _allocation(message: pb.ContainerAllocateResponse) -> ContainerAllocation:
    # model_construct: keep what the plugin sent even where devplug's models would refuse it
    # (the kubelet passes it on unchecked); conformance checks look at these values.
    return ContainerAllocation.model_construct(
        envs=dict(message.envs),
        mounts=tuple(
            Mount.model_construct(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in message.mounts
        ),
        devices=tuple(
            DeviceSpec.model_construct(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in message.devices
        ),
        annotations=dict(message.annotations),
        cdi_devices=tuple(c.name for c in message.cdi_devices),
    )


class RegistrationInfoClient:
    """The kubelet's plugin-watcher side of a ``pluginregistration.Registration`` socket."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub: Any = reg_pb_grpc.RegistrationStub(channel)

    async def get_info(self, *, deadline: float) -> reg_pb.PluginInfo:
        call = self._stub.GetInfo(reg_pb.InfoRequest(), timeout=deadline)
        return cast("reg_pb.PluginInfo", await await_call(call))

    async def notify(self, registered: bool, error: str, *, deadline: float) -> None:
        status = reg_pb.RegistrationStatus(plugin_registered=registered, error=error)
        await await_call(self._stub.NotifyRegistrationStatus(status, timeout=deadline))


class _RegistrationService:
    # Duck-typed servicer: the generated add_* function only looks the method up by name.
    def __init__(self, handler: RegisterHandler) -> None:
        self.Register = handler


def registration_server(path: str, handler: RegisterHandler) -> grpc.aio.Server:
    """A not yet started gRPC server for ``v1beta1.Registration`` bound to the unix socket ``path``."""
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(_RegistrationService(handler), server)
    server.add_insecure_port(f"unix:{path}")
    return server
