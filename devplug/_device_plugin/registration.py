"""The Register call on the kubelet's socket."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from devplug import _convert
from devplug._device_plugin.servicer import API_VERSION
from devplug._grpc_calls import await_call
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.errors import RegistrationError

if TYPE_CHECKING:
    from pathlib import Path

    from devplug.models import PluginOptions


async def register(
    kubelet_socket: Path,
    resource: str,
    endpoint: str,
    options: PluginOptions,
    timeout: float,
    *,
    version: str = API_VERSION,
) -> None:
    """Register ``resource`` served at ``endpoint`` (a file name in the kubelet's directory).

    ``options`` go in the request for kubelets up to 1.25; newer ones ask GetDevicePluginOptions
    while this call is in flight (so the server must already be serving).

    Raises RegistrationError with the kubelet's message and the gRPC status code name.
    """
    request = pb.RegisterRequest(
        version=version,
        endpoint=endpoint,
        resource_name=resource,
        options=_convert.options_to_pb(options),
    )
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub: Any = pb_grpc.RegistrationStub(channel)
        try:
            await await_call(stub.Register(request, timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(exc.details() or str(exc.code()), exc.code().name) from None
