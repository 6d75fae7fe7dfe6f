"""One NVIDIA resource (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``, ...) as a devplug plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from devplug.models import ContainerAllocation, Device
from devplug.plugin import DevicePlugin
from devplug_nvidia._allocate import CONTROL_NODES, ImexChannel, build_allocation, strip_replica
from devplug_nvidia.config import NvidiaSettings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Collection, Sequence

    from devplug_nvidia._model import GpuRecord

__all__ = ["NvidiaPlugin"]


class NvidiaPlugin(DevicePlugin):
    """Lists ``records`` by the device-ID strategy and answers Allocate as NVIDIA's plugin does.

    ``present``: the optional control nodes found on the host at start-up; ``imex``: the IMEX
    channels found then.
    """

    settings_class = NvidiaSettings

    def __init__(
        self,
        resource_name: str,
        records: Sequence[GpuRecord],
        config: NvidiaSettings,
        *,
        present: Collection[str] = CONTROL_NODES,
        imex: Sequence[ImexChannel] = (),
    ) -> None:
        self.resource_name = resource_name
        self.records = tuple(records)
        self.config = config
        self.present = frozenset(present)
        self.imex = tuple(imex)
        self._by_id = {r.device_id(config.device_id_strategy): r for r in self.records}

    def devices(self) -> list[Device]:
        """The device list: one per record, NUMA node from sysfs."""
        strategy = self.config.device_id_strategy
        return [
            Device(id=r.device_id(strategy), numa_nodes=() if r.numa_node is None else (r.numa_node,))
            for r in self.records
        ]

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        # Health and replicas come with part 2; until then the set never changes (returning
        # would be logged as the watch ending).
        yield self.devices()
        await anyio.sleep_forever()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        records = []
        for device in devices:
            record = self._by_id.get(strip_replica(device.id))
            if record is None:
                raise ValueError(f"unknown device: {device.id}")
            records.append(record)
        return build_allocation(
            records, self.config, resource_name=self.resource_name, present=self.present, imex=self.imex
        )
