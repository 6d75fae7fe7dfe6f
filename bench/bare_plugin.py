"""The floor: a bare grpc.aio DevicePlugin server with no framework, answering what devplug-fake answers.

python bench/bare_plugin.py SOCKET [KUBELET_SOCKET RESOURCE]

With KUBELET_SOCKET it also registers RESOURCE there once it serves, as a plugin must (the
start-up benchmark times process start → Register with it).

With ``BARE_PLUGIN_IMPORTS=mod1,mod2`` it first imports those modules and does nothing with them:
the start-up benchmark's floor for a plugin built on devplug's libraries (pydantic-settings,
structlog, anyio, asyncinotify), without any of devplug's own code.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from typing import Any

import grpc

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc


class Bare(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    async def Allocate(self, request: Any, context: Any) -> Any:
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"FAKE_VISIBLE_DEVICES": ",".join(c.devices_ids)})
                for c in request.container_requests
            ]
        )

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=list(c.available_deviceIDs)[: c.allocation_size]
                )
                for c in request.container_requests
            ]
        )


async def main(path: str, kubelet: str | None = None, resource: str = "") -> None:
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(Bare(), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    if kubelet is not None:
        async with grpc.aio.insecure_channel(f"unix:{kubelet}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version="v1beta1", endpoint=os.path.basename(path), resource_name=resource)
            )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    for module in filter(None, os.environ.get("BARE_PLUGIN_IMPORTS", "").split(",")):
        importlib.import_module(module)
    asyncio.run(main(*sys.argv[1:4]))
