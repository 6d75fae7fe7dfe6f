"""devplug._runtime.podresources against a PodResourcesLister served over a real unix socket: the
holders of devices given by device plugins and by DRA claims, and a clear error where no
kubelet answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplug._proto.podresources.v1 import api_pb2 as pb
from devplug._proto.podresources.v1 import api_pb2_grpc as pb_grpc
from devplug._runtime.podresources import Holder, PodResourcesError, read_holders

pytestmark = pytest.mark.anyio


class Lister(pb_grpc.PodResourcesListerServicer):
    """Answers List with the pods it is given, as the kubelet would."""

    def __init__(self, pods: list[pb.PodResources]) -> None:
        self.pods = pods

    async def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


@asynccontextmanager
async def kubelet(socket: Path, pods: list[pb.PodResources]) -> AsyncIterator[None]:
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(Lister(pods), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(None)


def gpu_pod(name: str, container: str, ids: list[str]) -> pb.PodResources:
    return pb.PodResources(
        name=name,
        namespace="ml",
        containers=[
            pb.ContainerResources(
                name=container, devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)]
            )
        ],
    )


def claim_pod(name: str, devices: list[tuple[str, str | None]]) -> pb.PodResources:
    resources = [
        pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-1", device_name=d, share_id=share)
        if share
        else pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-1", device_name=d)
        for d, share in devices
    ]
    return pb.PodResources(
        name=name,
        namespace="ml",
        containers=[
            pb.ContainerResources(
                name="main",
                dynamic_resources=[
                    pb.DynamicResource(claim_name="c", claim_namespace="ml", claim_resources=resources)
                ],
            )
        ],
    )


async def test_holders_of_both_apis(short_dir: Path) -> None:
    socket = short_dir / "kubelet.sock"
    pods = [
        gpu_pod("train", "worker", ["GPU-0", "GPU-1"]),
        gpu_pod("infer", "server", ["GPU-2"]),
        claim_pod("shared-a", [("gpu-3", "s-1")]),
        claim_pod("shared-b", [("gpu-3", "s-2")]),
        claim_pod("whole", [("gpu-4", None)]),
    ]
    async with kubelet(socket, pods):
        holders = await read_holders(socket)
    assert holders.of_resource("nvidia.com/gpu") == {
        "GPU-0": [Holder("ml", "train", "worker")],
        "GPU-1": [Holder("ml", "train", "worker")],
        "GPU-2": [Holder("ml", "infer", "server")],
    }
    assert holders.of_resource("example.com/other") == {}
    assert holders.of_driver("gpu.nvidia.com", "node-1") == {
        "gpu-3": [Holder("ml", "shared-a", "main"), Holder("ml", "shared-b", "main")],
        "gpu-4": [Holder("ml", "whole", "main")],
    }
    assert holders.of_driver("gpu.nvidia.com", "node-2") == {}
    assert str(Holder("ml", "train", "worker")) == "ml/train (container worker)"


async def test_no_kubelet_is_a_clear_error(short_dir: Path) -> None:
    socket = short_dir / "absent.sock"
    with pytest.raises(
        PodResourcesError, match=f"pod-resources API on {socket} did not answer List: UNAVAILABLE"
    ):
        await read_holders(socket, call_timeout=1)
