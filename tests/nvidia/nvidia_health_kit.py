"""Shared pieces of the NVIDIA health tests: a monitor running on a fake machine, and waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from devplug import Health, HealthSettings
from devplug_nvidia._gpu._health import HealthMonitor
from devplug_nvidia._gpu._model import GpuRecord
from devplug_nvidia._gpu._nvml import Nvml
from devplug_nvidia._gpu._xids import XidFilter
from devplug_nvidia.discovery import MigStrategy, apply_mig_strategy, discover_devices
from devplug_nvidia.testing import FakeNvml, fake_nvml, write_root

COOLDOWN = 0.3
"""The quiet period the tests run with (seconds)."""


@dataclass
class Monitored:
    fake: FakeNvml
    resources: dict[str, list[GpuRecord]]
    monitor: HealthMonitor

    @property
    def records(self) -> list[GpuRecord]:
        return [r for rs in self.resources.values() for r in rs]

    def unhealthy(self) -> set[str]:
        return {r.uuid for r in self.records if self.monitor.health(r.uuid) is Health.UNHEALTHY}


def discovered(fake: FakeNvml, root: Path, strategy: MigStrategy = "none") -> dict[str, list[GpuRecord]]:
    write_root(fake.model, root)
    with Nvml.open(fake) as nvml:
        records = discover_devices(nvml, sysfs=root / "sys", proc=root / "proc")
    return apply_mig_strategy(records, strategy)


@asynccontextmanager
async def monitoring(
    model: str,
    root: Path,
    strategy: MigStrategy = "none",
    *,
    cooldown: float = COOLDOWN,
    xids: XidFilter | None = None,
    module: Any = None,
    wait_timeout: float = 0.05,
    **settings: Any,
) -> AsyncIterator[Monitored]:
    """A started :class:`HealthMonitor` over ``model``'s devices (``module``: another NVML for it)."""
    fake = fake_nvml(model)
    resources = discovered(fake, root, strategy)
    records = [r for rs in resources.values() for r in rs]
    monitor = HealthMonitor(
        records,
        module=module if module is not None else fake,
        settings=HealthSettings(recovery_cooldown=cooldown, **settings),
        xids=xids,
        wait_timeout=wait_timeout,
        retry_interval=0.2,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        with anyio.fail_after(5):
            await monitor.wait_started()
        yield Monitored(fake, resources, monitor)
        tg.cancel_scope.cancel()
