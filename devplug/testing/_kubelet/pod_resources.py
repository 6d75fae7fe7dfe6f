"""The fake kubelet's pod-resources API (``v1.PodResourcesLister``), answered from its pod table.

As kubelet 1.37 answers it (``pkg/kubelet/apis/podresources/server_v1.go``, with the device
manager's and the DRA manager's parts from ``pkg/kubelet/cm``):

- ``List``: every running pod (the kubelet's active pods: an ended one is gone), each container
  with its devices. A device plugin's device is one ``ContainerDevices`` entry of its own, with
  its resource name and one ``TopologyInfo`` NUMA node; a device on several NUMA nodes gets an
  entry per node, a device without topology one entry without ``topology``. Each DRA claim is a
  ``DynamicResource`` (claim name and namespace) with a ``ClaimResource`` per prepared device:
  driver, pool, device, ``share_id`` when the driver sent one, and CDI devices. As the kubelet
  builds them, a claim's CDI devices accumulate over the devices of one driver: a device's entry
  lists its own CDI devices after those of the driver's devices before it in the claim.
- ``Get``: one pod, the same way; an unknown (or ended) pod is the kubelet's plain Go error, so
  status ``UNKNOWN`` with ``pod <name> in namespace <namespace> not found``.
- ``GetAllocatableResources``: the healthy devices of every registered resource, one entry per
  device and NUMA node as above (not what is free: what the node has to give).

CPU and memory fields are left empty: the kubelet's default ``none`` CPU and memory manager
policies report nothing there. Where it knowingly differs: pods are listed in the order they
got their first device (the kubelet's order is its pod manager's), containers in the order
they got devices (the kubelet's: the pod spec's, every container even one without devices), and
requests are not rate limited (the kubelet refuses more than 10 at once then 100 a second with
``RESOURCE_EXHAUSTED`` ``rejected by rate limit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from devplug._proto.podresources.v1 import api_pb2 as pb
from devplug._proto.podresources.v1 import api_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from devplug.testing._kubelet.pods import Pod, PodClaim, PodContainer, PodDevice, PodTable

    Context = grpc.aio.ServicerContext[Any, Any]
    AllocatableDevices = Callable[[], Iterable[tuple[str, PodDevice]]]


def not_found_error(namespace: str, name: str) -> str:
    """The kubelet's text for ``Get`` of a pod it does not run."""
    return f"pod {name} in namespace {namespace} not found"


def container_devices(resource: str, device: PodDevice) -> list[pb.ContainerDevices]:
    """A device as the kubelet lists it: one entry per NUMA node, or one without topology."""
    if not device.numa_nodes:
        return [pb.ContainerDevices(resource_name=resource, device_ids=[device.id])]
    return [
        pb.ContainerDevices(
            resource_name=resource,
            device_ids=[device.id],
            topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)]),
        )
        for node in device.numa_nodes
    ]


def dynamic_resource(claim: PodClaim) -> pb.DynamicResource:
    """A claim as the kubelet lists it, its CDI devices accumulated per driver as the kubelet does."""
    resources: list[pb.ClaimResource] = []
    for driver, devices in claim.drivers.items():
        cdi: list[pb.CDIDevice] = []
        for device in devices:
            cdi.extend(pb.CDIDevice(name=name) for name in device.cdi_device_ids)
            resource = pb.ClaimResource(
                cdi_devices=list(cdi), driver_name=driver, pool_name=device.pool, device_name=device.device
            )
            if device.share_id is not None:
                resource.share_id = device.share_id
            resources.append(resource)
    return pb.DynamicResource(
        claim_name=claim.name, claim_namespace=claim.namespace, claim_resources=resources
    )


def container_resources(container: PodContainer) -> pb.ContainerResources:
    return pb.ContainerResources(
        name=container.name,
        devices=[
            entry
            for resource, devices in container.devices.items()
            for device in devices
            for entry in container_devices(resource, device)
        ],
        dynamic_resources=[dynamic_resource(claim) for claim in container.claims.values()],
    )


def pod_resources(pod: Pod) -> pb.PodResources:
    return pb.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[container_resources(c) for c in pod.containers.values()],
    )


class _PodResourcesLister:
    # Duck-typed servicer: the generated add_* function only looks the methods up by name.
    def __init__(self, table: PodTable, allocatable: AllocatableDevices) -> None:
        self._table = table
        self._allocatable = allocatable

    async def List(
        self, request: pb.ListPodResourcesRequest, context: Context
    ) -> pb.ListPodResourcesResponse:
        return pb.ListPodResourcesResponse(
            pod_resources=[pod_resources(p) for p in self._table.pods.values()]
        )

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Context
    ) -> pb.AllocatableResourcesResponse:
        return pb.AllocatableResourcesResponse(
            devices=[
                entry
                for resource, device in self._allocatable()
                for entry in container_devices(resource, device)
            ]
        )

    async def Get(self, request: pb.GetPodResourcesRequest, context: Context) -> pb.GetPodResourcesResponse:
        pod = self._table.get(request.pod_namespace, request.pod_name)
        if pod is None:
            # A Go handler returning a plain error: the client sees status UNKNOWN with the text.
            await context.abort(
                grpc.StatusCode.UNKNOWN, not_found_error(request.pod_namespace, request.pod_name)
            )
        return pb.GetPodResourcesResponse(pod_resources=pod_resources(pod))


def pod_resources_server(path: str, table: PodTable, allocatable: AllocatableDevices) -> grpc.aio.Server:
    """A not yet started gRPC server for ``v1.PodResourcesLister`` bound to the unix socket ``path``.

    Args:
        table: the pods listed.
        allocatable: the healthy devices of the registered resources, ``(resource, device)``.
    """
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(_PodResourcesLister(table, allocatable), server)
    server.add_insecure_port(f"unix:{path}")
    return server
