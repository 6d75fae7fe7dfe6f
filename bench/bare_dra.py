"""The floor for DRA: a bare grpc.aio DRAPlugin (v1) with no framework, as a separate process.

    python bench/bare_dra.py SOCKET KUBECONFIG DRIVER

NodePrepareResources reads each claim with lightkube from the API server of KUBECONFIG, as a
driver must (the same GET devplug makes), checks its UID and allocation, and answers the shape
devplug answers: one entry per claim, a Device per allocated device of DRIVER with its request
name, pool and device, the claim's CDI device ID on the first device of each request. It writes
no CDI spec and no checkpoint. NodeUnprepareResources answers an empty entry per claim.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import grpc
import lightkube
from lightkube.resources.resource_v1 import ResourceClaim

from devplug._proto.dra.v1 import api_pb2 as pb
from devplug._proto.dra.v1 import api_pb2_grpc as pb_grpc


class Bare(pb_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, client: lightkube.AsyncClient, driver: str) -> None:
        self.client = client
        self.driver = driver

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = pb.NodePrepareResourcesResponse()
        for ref in request.claims:
            entry = response.claims[ref.uid]
            entry.SetInParent()
            try:
                claim = await self.client.get(ResourceClaim, ref.name, namespace=ref.namespace)
            except lightkube.ApiError as exc:
                entry.error = f"claim {ref.namespace}/{ref.name}: {exc.status.message}"
                continue
            allocation = claim.status.allocation if claim.status else None
            uid = claim.metadata.uid if claim.metadata else None
            if uid != ref.uid or allocation is None or allocation.devices is None:
                entry.error = f"claim {ref.namespace}/{ref.name} is not this allocated claim"
                continue
            named: set[str] = set()
            for result in allocation.devices.results or ():
                if result.driver != self.driver:
                    continue
                first = result.request not in named
                named.add(result.request)
                entry.devices.add(
                    request_names=[result.request],
                    pool_name=result.pool,
                    device_name=result.device,
                    cdi_device_ids=[f"k8s.{self.driver}/claim={ref.uid}-{result.request}"] if first else [],
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = pb.NodeUnprepareResourcesResponse()
        for ref in request.claims:
            response.claims[ref.uid].SetInParent()
        return response


async def main(path: str, kubeconfig: str, driver: str) -> None:
    client = lightkube.AsyncClient(lightkube.KubeConfig.from_file(kubeconfig))
    server = grpc.aio.server()
    pb_grpc.add_DRAPluginServicer_to_server(Bare(client, driver), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
