"""The fake kubelet's gRPC plumbing: typed clients and the Registration server.

The generated ``*_pb2_grpc`` modules are untyped; this is the only module of the testing kit
that touches them, so the rest of the kit sees typed methods and plain models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import anyio
import grpc

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug.errors import KubeletError
from devplug.models import ContainerAllocation, DeviceSpec, Mount, PluginOptions

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
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


class DialError(Exception):
    """A unix socket did not accept a gRPC connection in time."""


def error_from_rpc(exc: grpc.aio.AioRpcError) -> KubeletError:
    """A ``KubeletError`` carrying the plugin's status: message = details, code = status name."""
    return KubeletError(exc.details() or "", exc.code().name)


async def dial(path: str, *, within: float) -> grpc.aio.Channel:
    """Open a channel to the unix socket ``path`` and wait until it is connected.

    Like the kubelet's blocking dial, a missing socket is retried for ``within`` seconds.

    Raises:
        DialError: with Go's text for an expired dial context.
    """
    channel = grpc.aio.insecure_channel(f"unix:{path}", options=_CHANNEL_OPTIONS)
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
    """The kubelet's side of one connection to a plugin's ``v1beta1.DevicePlugin`` service."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._stub: Any = pb_grpc.DevicePluginStub(channel)

    async def get_options(self) -> PluginOptions:
        # No deadline: the kubelet uses a background context for this call.
        reply = cast("pb.DevicePluginOptions", await self._stub.GetDevicePluginOptions(pb.Empty()))
        return PluginOptions(
            pre_start_required=reply.pre_start_required,
            get_preferred_allocation_available=reply.get_preferred_allocation_available,
        )

    def list_and_watch(self) -> AsyncIterable[pb.ListAndWatchResponse]:
        return cast("AsyncIterable[pb.ListAndWatchResponse]", self._stub.ListAndWatch(pb.Empty()))

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in requests]
        )
        reply = cast("pb.AllocateResponse", await self._stub.Allocate(request))
        return [_allocation(r) for r in reply.container_responses]

    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        reply = cast("pb.PreferredAllocationResponse", await self._stub.GetPreferredAllocation(request))
        # The kubelet reads the first container response and treats none as "no preference".
        return list(reply.container_responses[0].deviceIDs) if reply.container_responses else []

    async def pre_start(self, device_ids: Sequence[str], *, deadline: float) -> None:
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        await self._stub.PreStartContainer(request, timeout=deadline)

    async def close(self) -> None:
        await self.channel.close(None)


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
        return cast("reg_pb.PluginInfo", await self._stub.GetInfo(reg_pb.InfoRequest(), timeout=deadline))

    async def notify(self, registered: bool, error: str, *, deadline: float) -> None:
        status = reg_pb.RegistrationStatus(plugin_registered=registered, error=error)
        await self._stub.NotifyRegistrationStatus(status, timeout=deadline)


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
