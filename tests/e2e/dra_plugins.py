"""DRA plugins for the real node, served by ``devplug run``: ``Reporting``, whose prepared devices
report a status (claim device status); ``Partitions``, two halves of a card that consume its
counters and name their type (partitionTypeAttribute)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio

from devplug import ContainerAllocation, Device, DevicePlugin
from devplug.dra import (
    AllocatedDevice,
    Claim,
    CounterConsumption,
    CounterSet,
    DeviceCondition,
    DeviceStatus,
    NetworkData,
    OpaqueConfig,
    PreparedDevice,
)


class Reporting(DevicePlugin):
    resource_name = "example.com/fake"

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        yield [Device(id=f"fake-{i}") for i in range(2)]
        await anyio.sleep_forever()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation(envs={"FAKE_VISIBLE_DEVICES": ",".join(d.id for d in devices)})

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        return [
            PreparedDevice(
                name=d.name,
                status=DeviceStatus(
                    conditions=(
                        DeviceCondition(type="Ready", status="True", reason="Prepared", message=d.name),
                    ),
                    data={"device": d.name},
                    network_data=NetworkData(interface_name=f"net-{d.name}", ips=("10.9.8.7/24",)),
                ),
            )
            for d in devices
        ]


class Partitions(DevicePlugin):
    resource_name = "example.com/fake"
    dra_partition_type_attribute = "profile"

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        card = CounterSet(name="card-0", counters={"cores": "8"})
        yield [
            Device(
                id=f"half-{i}",
                attributes={"profile": "half"},
                consumes_counters=(CounterConsumption(counter_set="card-0", counters={"cores": "4"}),),
                shared_counters=(card,),
            )
            for i in range(2)
        ]
        await anyio.sleep_forever()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation(envs={"FAKE_VISIBLE_DEVICES": ",".join(d.id for d in devices)})
