"""Device plugins that each get exactly one thing wrong, for the conformance tests.

Written straight against the generated gRPC code (none of devplug's runtime), the way a
plugin from another project meets the kubelet. Everything else they do right: serve, then
register; list at once; answer Allocate; register again on a fresh socket when the kubelet
restarts (their own socket deleted); remove their socket on SIGTERM.

    python tests/cli/broken_plugins.py MODE      # directory: $DEVPLUG_DEVICE_PLUGIN_DIR

MODE: ``good``, ``register-before-serving``, ``lowercase-health``, ``no-reregister``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import grpc

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

RESOURCE = "example.com/broken"
DEVICES = ("b0", "b1", "b2")
MODES = ("good", "register-before-serving", "lowercase-health", "no-reregister")
Context = grpc.aio.ServicerContext[Any, Any]


class Service(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    # The base class answers UNIMPLEMENTED for GetPreferredAllocation and PreStartContainer,
    # which the options do not offer.
    def __init__(self, health: str) -> None:
        self.health = health

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Context) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    async def ListAndWatch(
        self, request: pb.Empty, context: Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=self.health) for i in DEVICES])
        await anyio.sleep_forever()

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        responses = []
        for creq in request.container_requests:
            unknown = [i for i in creq.devices_ids if i not in DEVICES]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            responses.append(pb.ContainerAllocateResponse(envs={"BROKEN": ",".join(creq.devices_ids)}))
        return pb.AllocateResponse(container_responses=responses)


class Plugin:
    def __init__(self, directory: Path, mode: str) -> None:
        self.directory = directory
        self.mode = mode
        self.kubelet = directory / "kubelet.sock"
        self.instance = 0
        self.socket = directory / "unset"
        self.server: grpc.aio.Server | None = None

    async def serve(self) -> None:
        self.server = grpc.aio.server()
        health = "healthy" if self.mode == "lowercase-health" else "Healthy"
        pb_grpc.add_DevicePluginServicer_to_server(Service(health), self.server)
        self.server.add_insecure_port(f"unix:{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None
        self.socket.unlink(missing_ok=True)

    async def register(self) -> None:
        while not self.kubelet.exists():  # noqa: ASYNC110 - a test plugin may poll
            await anyio.sleep(0.02)
        request = pb.RegisterRequest(version="v1beta1", endpoint=self.socket.name, resource_name=RESOURCE)
        async with grpc.aio.insecure_channel(f"unix:{self.kubelet}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=15)

    async def start(self) -> None:
        # A fresh socket name per server instance, as newer kubelets require.
        self.instance += 1
        self.socket = self.directory / f"broken-{os.getpid()}-{self.instance}.sock"
        if self.mode == "register-before-serving":
            # The mistake: Register goes out first and the server follows a moment later. Only
            # the kubelet's blocking dial-back saves it.
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.register)
                await anyio.sleep(0.3)
                await self.serve()
        else:
            await self.serve()
            await self.register()

    async def run(self) -> None:
        await self.start()
        while True:
            await anyio.sleep(0.05)
            # The kubelet deletes every socket when it restarts; then it creates kubelet.sock.
            if self.mode != "no-reregister" and not self.socket.exists():
                await self.stop()
                await self.start()


async def main(mode: str) -> None:
    directory = Path(os.environ["DEVPLUG_DEVICE_PLUGIN_DIR"])
    plugin = Plugin(directory, mode)
    async with anyio.create_task_group() as tg:
        tg.start_soon(plugin.run)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        tg.cancel_scope.cancel()
    with anyio.CancelScope(shield=True):
        await plugin.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        sys.exit(f"usage: broken_plugins.py {{{','.join(MODES)}}}")
    anyio.run(main, sys.argv[1], backend="asyncio")
