"""Conversions between devplug's models and the generated protobuf messages.

Used by the servicer and the registration client: device-plugin models to the wire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Iterable

    from devplug.models import ContainerAllocation, Device, PluginOptions


def options_to_pb(options: PluginOptions) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(
        pre_start_required=options.pre_start_required,
        get_preferred_allocation_available=options.get_preferred_allocation_available,
    )


def device_to_pb(device: Device) -> pb.Device:
    # An empty TopologyInfo and none at all mean the same to the kubelet; leave it unset
    # unless there is a NUMA node to report.
    topology = (
        pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in device.numa_nodes]) if device.numa_nodes else None
    )
    return pb.Device(ID=device.id, health=device.health.value, topology=topology)


def list_response(devices: Iterable[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_to_pb(d) for d in devices])


def allocation_to_pb(allocation: ContainerAllocation) -> pb.ContainerAllocateResponse:
    # Every Allocate converts one: fields the plugin left empty are not passed at all (an
    # empty list or map costs the message constructor as much as a short one).
    fields: dict[str, Any] = {}
    if allocation.envs:
        fields["envs"] = allocation.envs
    if allocation.mounts:
        fields["mounts"] = [
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ]
    if allocation.devices:
        fields["devices"] = [
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in allocation.devices
        ]
    if allocation.annotations:
        fields["annotations"] = allocation.annotations
    if allocation.cdi_devices:
        fields["cdi_devices"] = [pb.CDIDevice(name=name) for name in allocation.cdi_devices]
    return pb.ContainerAllocateResponse(**fields)
