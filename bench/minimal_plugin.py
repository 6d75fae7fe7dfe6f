"""The smallest complete plugin, for ``devplug run minimal_plugin:Minimal`` in the start-up benchmark.

One device that never changes, and an environment variable naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devplug import ContainerAllocation, Device, DevicePlugin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence


class Minimal(DevicePlugin):
    resource_name = "example.com/minimal"

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        yield [Device(id="minimal-0")]

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation(envs={"MINIMAL_DEVICES": ",".join(d.id for d in devices)})
