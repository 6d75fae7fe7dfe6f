"""Helpers for the DRA tests: a driver in the background, and calls as the kubelet makes them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from devplug import DevicePlugin
from devplug._proto.dra.v1 import api_pb2 as v1
from devplug._proto.dra.v1 import api_pb2_grpc as v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as v1beta1
from devplug._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.dra import DraDriver
from devplug.testing import FakeKubeAPI, serving_dra

NODE = "node-1"


def driving(
    plugins: Sequence[DevicePlugin], api: FakeKubeAPI, root: Path, **overrides: object
) -> AbstractAsyncContextManager[DraDriver]:
    """A DraDriver for ``plugins`` against ``api``, serving while the block runs (the testing
    kit's serving_dra, with the CDI directory beside the kubelet root as the tests expect it)."""
    values: dict[str, Any] = {"cdi_dir": root / "cdi", **overrides}
    return serving_dra(list(plugins), api, root / "kubelet", node_name=NODE, **values)


async def get_info(path: Path) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        return await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=1)


async def notify(path: Path, registered: bool = True, error: str = "") -> None:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=registered, error=error), timeout=5
        )


async def prepare(path: Path, *claims: tuple[str, str, str], version: str = "v1") -> dict[str, Any]:
    """NodePrepareResources for (namespace, name, uid) claims: {uid: response entry}."""
    pb, grpc_mod = (v1, v1_grpc) if version == "v1" else (v1beta1, v1beta1_grpc)
    request = pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
    )
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        response = await grpc_mod.DRAPluginStub(channel).NodePrepareResources(request, timeout=45)
    return dict(response.claims)


async def unprepare(path: Path, *claims: tuple[str, str, str]) -> dict[str, Any]:
    request = v1.NodeUnprepareResourcesRequest(
        claims=[v1.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
    )
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        response = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(request, timeout=45)
    return dict(response.claims)


@asynccontextmanager
async def health_stream(path: Path) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        call = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb.NodeWatchResourcesRequest()
        )
        try:
            yield call
        finally:
            call.cancel()
