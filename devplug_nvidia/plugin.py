"""One NVIDIA resource (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``, ...) as a devplug plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import structlog

from devplug.metrics import note_health_reason
from devplug.models import ContainerAllocation, Device, Health
from devplug.plugin import DevicePlugin
from devplug_nvidia._container._allocate import CONTROL_NODES, ImexChannel, build_allocation, strip_replica
from devplug_nvidia._device_plugin._preferred import preferred
from devplug_nvidia._device_plugin._sharing import REPLICA_SEPARATOR, replica_id
from devplug_nvidia._gpu._mps import MpsDaemonError
from devplug_nvidia.config import NvidiaSettings

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Collection, Mapping, Sequence

    from devplug_nvidia._device_plugin._sharing import SharedResource
    from devplug_nvidia._gpu._health import HealthMonitor
    from devplug_nvidia._gpu._links import LinkMatrix
    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia._gpu._mps import MpsDaemon

__all__ = ["NvidiaPlugin"]

log = structlog.get_logger("devplug_nvidia.plugin")

MPS_CHECK_INTERVAL = 5.0
"""Seconds between checks of the MPS control daemon (upstream polls every 5 s)."""


class NvidiaPlugin(DevicePlugin):
    """Lists ``records`` by the device-ID strategy and answers Allocate as NVIDIA's plugin does.

    Args:
        resource_name: the resource served.
        records: its devices (full GPUs or MIG devices).
        config: the plugin's settings.
        present: the optional control nodes found on the host at start-up.
        imex: the IMEX channels found then.
        replicas: record UUID → how many replicas (``<id>::<n>``) it is listed as; absent: once.
        health: the process's health monitor; None: every device Healthy.
        mps: the MPS control daemon of this resource (``sharing.mps``); while it is not ready
            the devices are listed Unhealthy and Allocate fails saying why.
        links: the GPU link matrix read at start-up, for topology-aware preferred allocation;
            None: NUMA locality only.
    """

    settings_class = NvidiaSettings
    mps_check_interval: float = MPS_CHECK_INTERVAL
    """Seconds between checks of the MPS control daemon while serving."""

    def __init__(
        self,
        resource_name: str,
        records: Sequence[GpuRecord],
        config: NvidiaSettings,
        *,
        present: Collection[str] = CONTROL_NODES,
        imex: Sequence[ImexChannel] = (),
        replicas: Mapping[str, int] | None = None,
        health: HealthMonitor | None = None,
        mps: MpsDaemon | None = None,
        links: LinkMatrix | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.links = links
        self.records = tuple(records)
        self.config = config
        self.present = frozenset(present)
        self.imex = tuple(imex)
        self.replicas: Mapping[str, int] = dict(replicas or {})
        self.health = health
        self.mps = mps
        self.fail_requests_greater_than_one = config.sharing.fail_requests_greater_than_one
        """Reject a container request for more than one replica (the sharing section's setting)."""
        self._by_id = {r.device_id(config.device_id_strategy): r for r in self.records}
        self._mps_error: str | None = None
        self._listed_ids = [d.id for d in self.devices()]  # fixed for the plugin's life

    @classmethod
    def for_resource(
        cls,
        resource: SharedResource,
        config: NvidiaSettings,
        *,
        present: Collection[str] = CONTROL_NODES,
        imex: Sequence[ImexChannel] = (),
        health: HealthMonitor | None = None,
        mps: MpsDaemon | None = None,
        links: LinkMatrix | None = None,
    ) -> NvidiaPlugin:
        """The plugin for one resource of :func:`devplug_nvidia._device_plugin._sharing.apply_sharing`."""
        plugin = cls(
            resource.name,
            resource.records,
            config,
            present=present,
            imex=imex,
            replicas=resource.replicas,
            health=health,
            mps=mps,
            links=links,
        )
        plugin.fail_requests_greater_than_one = resource.fail_requests_greater_than_one
        return plugin

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str] | None:
        """NVLink- and PCIe-aware for full GPUs, upstream's greedy policy for replicas and MIG.

        The link matrix was read once at start-up: nothing here calls NVML, and a GPU that fell
        off the bus has no links instead of failing the request.
        """
        lost = [r.uuid for r in self.records if self.health is not None and self.health.fatal_reason(r.uuid)]
        links = self.links.without(lost) if self.links is not None and lost else self.links
        return preferred(
            [d.id for d in available],
            [d.id for d in must_include],
            size,
            records_by_id=self._by_id,
            links=links,
            policy=self.config.shared_devices_allocation_policy,
            advertised_ids=self._listed_ids,
        )

    # -- the device list ------------------------------------------------------------------------

    def record_of(self, device_id: str) -> GpuRecord | None:
        """The record behind a listed ID (a replica's device for ``<id>::<n>``), or None."""
        return self._by_id.get(strip_replica(device_id))

    def device_health(self, record: GpuRecord) -> Health:
        """What is reported for ``record`` (and each of its replicas) now."""
        if self._mps_error is not None:
            return Health.UNHEALTHY
        return self.health.health(record.uuid) if self.health is not None else Health.HEALTHY

    def devices(self) -> list[Device]:
        """The device list: one per record, or one per replica of a shared record; replicas
        copy the health and NUMA node of their device."""
        strategy = self.config.device_id_strategy
        devices: list[Device] = []
        for record in self.records:
            numa = () if record.numa_node is None else (record.numa_node,)
            health = self.device_health(record)
            base = record.device_id(strategy)
            count = self.replicas.get(record.uuid, 1)
            ids = [replica_id(base, n) for n in range(count)] if count > 1 else [base]
            devices.extend(Device(id=i, health=health, numa_nodes=numa) for i in ids)
        return devices

    async def watch_devices(self) -> AsyncGenerator[Sequence[Device], None]:
        # A new full list whenever the health monitor or the MPS daemon's state changes it.
        version = self.health.version if self.health is not None else 0
        await self._check_mps()
        last = self.devices()
        yield last
        while True:
            if self.health is None and self.mps is None:
                await anyio.sleep_forever()
            with anyio.move_on_after(self.mps_check_interval if self.mps is not None else None):
                if self.health is not None:
                    version = await self.health.wait_changed(version)
                else:
                    await anyio.sleep_forever()
            await self._check_mps()
            devices = self.devices()
            if devices != last:
                self._note_reasons(last, devices)
                last = devices
                yield devices

    def _note_reasons(self, before: Sequence[Device], after: Sequence[Device]) -> None:
        """Tell the metrics why devices changed health (XID, ECC, MPS daemon, recovery)."""
        old = {d.id: d.health for d in before}
        changed = [d.id for d in after if d.id in old and old[d.id] is not d.health]
        by_reason: dict[str, list[str]] = {}
        for device_id in changed:
            record = self.record_of(device_id)
            if self._mps_error is not None:
                reason = "mps_daemon_not_ready"
            elif record is not None and self.health is not None:
                reason = self.health.reason_label(record.uuid)
            else:
                reason = "recovered"
            by_reason.setdefault(reason, []).append(device_id)
        for reason, ids in by_reason.items():
            note_health_reason(self.resource_name, ids, reason)

    async def _check_mps(self) -> None:
        if self.mps is None:
            return
        try:
            await anyio.to_thread.run_sync(self.mps.check)
            error = None
        except MpsDaemonError as exc:
            error = str(exc)
        if error != self._mps_error:
            if error is None:
                log.info("mps_daemon_ready", resource=self.resource_name)
            else:
                log.warning(
                    "mps_daemon_not_ready", resource=self.resource_name, reason=error, devices="Unhealthy"
                )
        self._mps_error = error

    # -- Allocate -------------------------------------------------------------------------------

    def validate_request(self, device_ids: Sequence[str]) -> list[GpuRecord]:
        """The records for one container's request, checked as upstream checks it.

        Raises:
            ValueError: an unknown ID, or more than one replica while
                ``failRequestsGreaterThanOne`` is on (upstream's messages).
        """
        if (
            self.fail_requests_greater_than_one
            and len(device_ids) > 1
            and any(REPLICA_SEPARATOR in i for i in device_ids)
        ):
            raise ValueError(
                f"invalid request: maximum request size for shared resources is 1; found {len(device_ids)}"
            )
        records = []
        for device_id in device_ids:
            record = self.record_of(device_id)
            if record is None:
                raise ValueError(f"invalid request: unknown device: {device_id}")
            records.append(record)
        return records

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        records = self.validate_request([d.id for d in devices])
        if self.mps is not None:
            await self._check_mps()
            if self._mps_error is not None:
                raise MpsDaemonError(self._mps_error)
        return build_allocation(
            records, self.config, resource_name=self.resource_name, present=self.present, imex=self.imex
        )
