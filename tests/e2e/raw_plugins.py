"""Bare gRPC plugins that record what a kubelet does to them: the probes of the kubelet tests.

Nothing of devplug's runtime is used here, only its generated protobuf modules: these plugins
answer exactly as told and write down every call with its time, so that one scenario can be
played against the real kubelet of e2e/node and against FakeKubelet and the two records held
side by side.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as dp_pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from devplug._proto.dra.v1 import api_pb2 as dra_v1_pb
from devplug._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as dra_v1beta1_pb
from devplug._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from devplug._proto.drahealth.v1 import api_pb2 as health_v1_pb
from devplug._proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1_pb
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.support import wait_until


@dataclass
class Calls:
    """Every call a plugin got: (monotonic time, RPC name, detail)."""

    log: list[tuple[float, str, Any]] = field(default_factory=list)

    def add(self, rpc: str, detail: Any = None) -> None:
        self.log.append((time.monotonic(), rpc, detail))

    def times(self, rpc: str) -> list[float]:
        return [t for t, name, _ in self.log if name == rpc]

    def details(self, rpc: str) -> list[Any]:
        return [d for _, name, d in self.log if name == rpc]

    def count(self, rpc: str) -> int:
        return len(self.times(rpc))

    async def wait(self, rpc: str, count: int = 1, within: float = 30) -> None:
        await wait_until(
            lambda: self.count(rpc) >= count, timeout=within, interval=0.02, what=f"{count} x {rpc}"
        )


def accepts_connections(path: Path) -> bool:
    """Whether a server listens on the unix socket ``path`` now."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class Registration(reg_grpc.RegistrationServicer):
    """A plugin-watcher registration socket: GetInfo answers ``info`` after ``delays[i]`` seconds
    on its i-th call (the last delay for the calls after), NotifyRegistrationStatus is recorded."""

    def __init__(self, calls: Calls, info: reg_pb.PluginInfo, delays: Sequence[float] = (0.0,)) -> None:
        self.calls, self.info, self.delays = calls, info, list(delays)

    async def GetInfo(self, request: Any, context: Any) -> reg_pb.PluginInfo:
        n = self.calls.count("GetInfo")
        self.calls.add("GetInfo")
        await anyio.sleep(self.delays[min(n, len(self.delays) - 1)])
        return self.info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> reg_pb.RegistrationStatusResponse:
        self.calls.add("Notify", (request.plugin_registered, request.error))
        return reg_pb.RegistrationStatusResponse()


class DevicePlugin(dp_grpc.DevicePluginServicer):
    """A device plugin with ``count`` healthy devices; records each stream's opening and end."""

    def __init__(self, calls: Calls, count: int = 2, prefix: str = "dev") -> None:
        self.calls, self.count, self.prefix = calls, count, prefix

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> dp_pb.DevicePluginOptions:
        self.calls.add("GetDevicePluginOptions")
        return dp_pb.DevicePluginOptions()

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[dp_pb.ListAndWatchResponse]:
        self.calls.add("ListAndWatch")
        try:
            yield dp_pb.ListAndWatchResponse(
                devices=[dp_pb.Device(ID=f"{self.prefix}-{i}", health="Healthy") for i in range(self.count)]
            )
            await anyio.sleep_forever()
        finally:
            self.calls.add("ListAndWatch ended")

    async def Allocate(self, request: Any, context: Any) -> dp_pb.AllocateResponse:
        self.calls.add("Allocate", [list(c.devices_ids) for c in request.container_requests])
        return dp_pb.AllocateResponse(
            container_responses=[dp_pb.ContainerAllocateResponse() for _ in request.container_requests]
        )


class Dra:
    """A DRAPlugin service of one wire ``version`` ("v1" or "v1beta1"): each claim gets the
    device ``devices[claim name]`` = (request, pool, device), without CDI devices."""

    def __init__(self, calls: Calls, devices: dict[str, tuple[str, str, str]], version: str) -> None:
        self.calls, self.devices, self.version = calls, devices, version
        self.pb: Any = {"v1": dra_v1_pb, "v1beta1": dra_v1beta1_pb}[version]

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        self.calls.add(f"{self.version}.NodePrepareResources", [c.name for c in request.claims])
        answer = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            req, pool, dev = self.devices[claim.name]
            answer.claims[claim.uid].devices.append(
                self.pb.Device(request_names=[req], pool_name=pool, device_name=dev)
            )
        return answer

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        self.calls.add(f"{self.version}.NodeUnprepareResources", [c.name for c in request.claims])
        answer = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            answer.claims[claim.uid].CopyFrom(self.pb.NodeUnprepareResourceResponse())
        return answer


class HealthV1(health_v1_grpc.DRAResourceHealthServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls.add("v1.NodeWatchResources")
        yield health_v1_pb.NodeWatchResourcesResponse()
        await anyio.sleep_forever()


class HealthV1alpha1(health_v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls.add("v1alpha1.NodeWatchResources")
        yield health_v1alpha1_pb.NodeWatchResourcesResponse()
        await anyio.sleep_forever()


_ADD = {
    Registration: reg_grpc.add_RegistrationServicer_to_server,
    DevicePlugin: dp_grpc.add_DevicePluginServicer_to_server,
    HealthV1: health_v1_grpc.add_DRAResourceHealthServicer_to_server,
    HealthV1alpha1: health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server,
}


@asynccontextmanager
async def serving(path: Path, *servicers: object) -> AsyncIterator[grpc.aio.Server]:
    """Serve ``servicers`` on the unix socket ``path`` (removed again at the end)."""
    path.unlink(missing_ok=True)
    server = grpc.aio.server()
    for servicer in servicers:
        if isinstance(servicer, Dra):
            grpc_module = dra_v1_grpc if servicer.version == "v1" else dra_v1beta1_grpc
            grpc_module.add_DRAPluginServicer_to_server(servicer, server)
        else:
            _ADD[type(servicer)](servicer, server)  # type: ignore[operator]
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield server
    finally:
        await server.stop(None)
        path.unlink(missing_ok=True)


async def register(kubelet_socket: Path, resource: str, endpoint: str) -> tuple[float, str]:
    """Register a device plugin; (seconds it took, "" or the kubelet's error message)."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = dp_grpc.RegistrationStub(channel)
        start = time.monotonic()
        try:
            await stub.Register(
                dp_pb.RegisterRequest(version="v1beta1", endpoint=endpoint, resource_name=resource),
                timeout=30,
            )
        except grpc.aio.AioRpcError as exc:
            return time.monotonic() - start, exc.details() or exc.code().name
        return time.monotonic() - start, ""


def plugin_info(kind: str, name: str, endpoint: str, versions: Sequence[str]) -> reg_pb.PluginInfo:
    return reg_pb.PluginInfo(type=kind, name=name, endpoint=endpoint, supported_versions=list(versions))
