"""devplug-nvidia as a DRA driver: NVIDIA's GPUs as NVIDIA's own DRA driver serves them.

``devplug-nvidia --api dra`` (driver ``gpu.nvidia.com``) publishes one pool per node with the
devices, names, attributes and capacities of NVIDIA's ``gpu-kubelet-plugin`` v0.5.0: full GPUs
without MIG mode as ``gpu-<minor>``, and the MIG devices that exist (static MIG) as
``gpu-<parent minor>-mig-<profile>-<GI profile ID>-<placement start>``; a MIG-enabled GPU is
announced only through its MIG devices. devplug's own attributes are off, so that selectors
written for NVIDIA's driver match the same devices. With ``ConsumableShares`` and
``--consumable-shares`` the devices are shared by claims (:mod:`~devplug_nvidia._dra._shares`);
what NVIDIA does and devplug-nvidia does not is refused at start
(:mod:`~devplug_nvidia._dra._support`).

A claim is prepared as NVIDIA prepares it: one transient CDI spec per claim,
``k8s.gpu.nvidia.com-claim_<uid>.yaml``, with the ID ``k8s.gpu.nvidia.com/claim=<uid>-<device>``
for each device. devplug writes that file with the claim's checkpoint entry, writes it again
when a repeated prepare finds it missing, and removes it at unprepare.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from devplug._text import os_error_text
from devplug.errors import ConfigError, DevplugError, config_error_in
from devplug.models import CdiSpecFile, ContainerAllocation, PreparedDevice
from devplug.plugin import DevicePlugin
from devplug_nvidia._config._feature_gates import DRA_LIST_TYPE_ATTRIBUTES, FABRIC_MANAGER_PARTITIONING
from devplug_nvidia._container._allocate import CONTROL_NODES, build_allocation, present_nodes
from devplug_nvidia._dra._cdi import build_claim_spec, claim_device_id, claim_spec_file, spec_yaml
from devplug_nvidia._dra._devices import DRIVER_NAME, announced, device_of
from devplug_nvidia._dra._dynamic import (
    DynamicMig,
    creates_mig_devices,
    destroys_mig_devices,
    dynamic_mig,
    shared_key,
)
from devplug_nvidia._dra._shares import ShareConfigs, shared_device
from devplug_nvidia._dra._sharing import (
    SharingError,
    SharingManager,
    plan,
    sharing_manager,
    with_device_edits,
)
from devplug_nvidia._dra._support import check_fabric, check_supported
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.discovery import GPU_RESOURCE, NvmlSource, discover_devices, nvml_source

if TYPE_CHECKING:
    import os
    from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence

    from devplug.cdi import ContainerEdits
    from devplug.models import AllocatedDevice, Claim, Device, OpaqueConfig
    from devplug_nvidia._container._cdi_driver import DriverFiles
    from devplug_nvidia._dra._health import DraHealthMonitor
    from devplug_nvidia._gpu._model import GpuRecord

__all__ = ["DRIVER_NAME", "NvidiaDraPlugin", "run_dra"]

log = structlog.get_logger("devplug_nvidia.dra")


class NvidiaDraPlugin(DevicePlugin):
    """The node's GPUs and MIG devices, published and prepared as NVIDIA's DRA driver does.

    Args:
        records: what discovery found, read with ``details=True`` (every GPU and MIG device).
        config: the plugin's settings (dev root, driver root, the CDI hook).
        driver: the DRA driver name, whose ``k8s.<driver>/claim`` is the CDI kind.
        present: the optional control nodes found on the host at start-up.
        driver_files: the driver files the claim specs mount (None: device nodes only).
        proc: where this process sees the host's ``/proc`` (MIG capability files).
        health: the NVML health monitor whose health and taints the devices carry (None: every
            device Healthy, no taints); it runs while :meth:`watch_devices` is iterated.
        dynamic_mig: the MIG devices created at prepare (``DynamicMIG``; None: static MIG only).
    """

    resource_name = GPU_RESOURCE
    settings_class = NvidiaSettings
    dra_standard_attributes = False
    # Dynamic MIG devices (the only ones that consume counters) carry their profile: the slices'
    # partitionTypeAttribute (1.37, alpha) where the API server keeps it.
    dra_partition_type_attribute = "profile"
    nvml_source: NvmlSource | None = None
    """Where NVML comes from (set by :meth:`discover`; None: from the settings)."""

    def __init__(
        self,
        records: Sequence[GpuRecord],
        config: NvidiaSettings,
        *,
        driver: str = DRIVER_NAME,
        present: Collection[str] = CONTROL_NODES,
        driver_files: DriverFiles | None = None,
        proc: Path = Path("/proc"),
        health: DraHealthMonitor | None = None,
        dynamic_mig: DynamicMig | None = None,
    ) -> None:
        self.config = config
        self.driver = driver
        self.present = frozenset(present)
        self.driver_files = driver_files
        self.proc = proc
        self.records = announced(records) if dynamic_mig is None else dynamic_mig.kept(announced(records))
        fabric = config.gates[FABRIC_MANAGER_PARTITIONING]
        self.devices = [device_of(r, fabric=fabric) for r in self.records]
        self._by_name = {d.name: r for d, r in zip(self.devices, self.records, strict=True)}
        self._by_id = {r.uuid: r for r in self.records}
        self.dynamic_mig = dynamic_mig
        self.devices += dynamic_mig.devices if dynamic_mig is not None else []
        self.consumable_shares = config.shares
        """``--consumable-shares`` (None: devices go to one claim at a time)."""
        if self.consumable_shares is not None:
            self.devices = [shared_device(d, self.consumable_shares) for d in self.devices]
        self.health = health

    @classmethod
    def from_settings(cls, settings: NvidiaSettings) -> NvidiaDraPlugin:  # type: ignore[override]
        """:meth:`discover` for ``settings`` (what ``devplug run`` calls)."""
        return cls.discover(settings)

    @classmethod
    def discover(
        cls,
        settings: NvidiaSettings,
        *,
        module: Any = None,
        sysfs: str | os.PathLike[str] | None = None,
        proc: str | os.PathLike[str] | None = None,
    ) -> NvidiaDraPlugin:
        """Discovery (with the details DRA publishes) and what the claim specs need, from
        ``settings``; NVML, sysfs and proc as :func:`~devplug_nvidia.discovery.nvml_source`
        chooses them (``module``: a pynvml-like module, e.g. a fake machine).

        Raises:
            ConfigError: a gate or flag asks for what devplug-nvidia does not do.
            NvmlError: NVML failed.
        """
        from devplug_nvidia._container._cdi import driver_view
        from devplug_nvidia._container._cdi_driver import find_driver_files
        from devplug_nvidia._dra._health import dra_health_monitor

        check_supported(settings)
        source = nvml_source(settings, module=module, sysfs=sysfs, proc=proc)
        check_fabric(settings, proc=source.proc, sysfs=source.sysfs)
        driver = settings.driver_name or DRIVER_NAME
        with source.open() as nvml:
            records = discover_devices(nvml, sysfs=source.sysfs, proc=source.proc, details=True)
            dynamic = dynamic_mig(settings, nvml, records, source, settings.dra_plugins_dir / driver)
        version = next((r.details.driver_version for r in records if r.details is not None), None)
        files = find_driver_files(driver_view(settings), version)
        if records and files is None:
            log.warning(
                "cdi_driver_files_not_found",
                root=driver_view(settings),
                note="the claim specs inject device nodes only; containers need the driver another way",
            )
        plugin = cls(
            records,
            settings,
            driver=driver,
            present=present_nodes(Path(settings.effective_dev_root)),
            driver_files=files,
            proc=source.proc,
            health=dra_health_monitor(settings, announced(records), driver, module=source.module),
            dynamic_mig=dynamic,
        )
        plugin.nvml_source = source  # the same NVML for the claims' compute modes
        return plugin

    def current_devices(self) -> list[Device]:
        """The devices with their health and taints now."""
        if self.health is None:
            return self.devices
        health = self.health
        return [
            d.model_copy(
                update={
                    "health": health.health(d.id),
                    "health_message": health.health_message(d.id),
                    "taints": health.taints(d.id),
                }
            )
            for d in self.devices
        ]

    async def watch_devices(self) -> AsyncGenerator[Sequence[Device], None]:
        # A new list whenever the health monitor changes a device's health or taints. The
        # monitor runs while the devices are watched, however the plugin is served; one
        # already run by someone else is left to them (DraHealthMonitor.run waits its turn).
        from devplug_nvidia._dra._health import MonitorTask

        health = self.health
        if health is None:
            yield self.devices
            await anyio.sleep_forever()
            return
        monitor = MonitorTask(health)
        try:
            version = health.version
            last = self.current_devices()
            yield last
            while True:
                version = await monitor.wait_changed(version)
                devices = self.current_devices()
                if devices != last:
                    last = devices
                    yield devices
        finally:
            await monitor.stop()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        """The device plugin's answer for ``devices`` (unused by DRA, where claims are prepared)."""
        records = [self._by_id[d.id] for d in devices]
        return build_allocation(records, self.config, resource_name=self.resource_name, present=self.present)

    def claim_spec(
        self,
        claim_uid: str,
        devices: Sequence[AllocatedDevice],
        extra: Mapping[str, ContainerEdits] | None = None,
    ) -> CdiSpecFile:
        """The claim's CDI spec file for ``devices`` (reads the MIG capability files), with the
        ``extra`` edits of some devices by name (MPS).

        Raises:
            CapabilityError: a MIG device's capability files cannot be read.
        """
        # Two shares of one device are one device of the spec.
        names = dict.fromkeys(d.name for d in devices)
        spec = build_claim_spec(
            self.driver,
            claim_uid,
            [(name, self._by_name[name]) for name in names],
            self.config,
            present=self.present,
            driver_files=self.driver_files,
            proc=self.proc,
        )
        if extra:
            spec = with_device_edits(spec, claim_uid, extra)
        return CdiSpecFile(name=claim_spec_file(self.driver, claim_uid), text=spec_yaml(spec))

    @functools.cached_property
    def sharing(self) -> SharingManager:
        """Applies and undoes the claims' time-slicing and MPS settings."""
        source = self.nvml_source or nvml_source(self.config)
        return sharing_manager(self.config, source, self.config.dra_plugins_dir / self.driver)

    def _device_type(self, name: str) -> str:
        """The device's type as NVIDIA names it: ``gpu``, ``mig``, or ``migdyn`` (DynamicMIG)."""
        if self.dynamic_mig is not None and self.dynamic_mig.owns(name):
            return "migdyn"
        return self._by_name[name].kind

    @functools.cached_property
    def share_configs(self) -> ShareConfigs:
        """The configs the claims' shared devices were prepared with (consumable shares)."""
        return ShareConfigs(self.config.dra_plugins_dir / self.driver / "shares")

    @creates_mig_devices
    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice]:
        """Prepare as NVIDIA does: the opaque configs decoded and matched to the devices
        (:mod:`~devplug_nvidia._dra._config`), sharing applied per group, the claim's CDI spec.
        A device shared with other claims (consumable shares) must get the same config as theirs.

        Raises:
            OpaqueConfigError: a config cannot be decoded, applied to its devices or is invalid.
            ShareConflictError: a shared device's config differs from another claim's.
            SharingError: time-slicing or MPS could not be set up (nothing is left behind).
            CapabilityError: a MIG device's capability files cannot be read.
        """
        groups = plan(
            self.driver,
            claim,
            devices,
            config,
            record_of=self._by_name.__getitem__,
            gates=self.config.gates,
            type_of=self._device_type,
        )
        consumable = self.consumable_shares is not None
        configs: dict[str, Any] = {}
        if consumable:
            configs = {name: g.config.model_dump(mode="json") for g in groups for name, _ in g.devices}
            used = {d.name for d in devices if d.other_shares}
            await anyio.to_thread.run_sync(self.share_configs.check, claim.uid, configs, used)
        extra: dict[str, ContainerEdits] = {}
        try:
            if any(g.shares for g in groups):
                extra = await anyio.to_thread.run_sync(self.sharing.apply, claim.uid, groups)
            if extra:
                spec = await anyio.to_thread.run_sync(self.claim_spec, claim.uid, devices, extra)
            else:
                spec = await anyio.to_thread.run_sync(self.claim_spec, claim.uid, devices)
            if consumable:
                await anyio.to_thread.run_sync(self.share_configs.record, claim.uid, configs)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._undo_prepare, claim.uid, devices)
            raise
        return [
            PreparedDevice(
                name=d.name,
                requests=(d.request,),
                cdi_devices=(claim_device_id(self.driver, claim.uid, d.name),),
                cdi_spec_file=spec,
                share_id=d.share_id,
            )
            for d in devices
        ]

    def _undo_prepare(self, claim_uid: str, devices: Sequence[AllocatedDevice]) -> None:
        """Undo a prepare that failed: the claim's sharing, and (consumable shares) what its
        devices that no other claim uses needed as a whole."""
        self.sharing.undo(claim_uid)
        if self.consumable_shares is None:
            return
        self.share_configs.forget(claim_uid)
        for name in dict.fromkeys(d.name for d in devices if not d.other_shares):
            record = self._by_name.get(name)
            if record is None or record.kind != "gpu":
                continue
            try:
                self.sharing.release_gpu(record.uuid)
            except SharingError as exc:  # the prepare's own error is the one to report
                log.error(
                    "rollback_failed",
                    claim_uid=claim_uid,
                    device=name,
                    error=str(exc),
                    note="time slice left set",
                )

    @destroys_mig_devices
    async def unprepare_claim(self, claim: Claim) -> None:
        """Undo the claim's sharing (stop its MPS daemons, reset time slices); its CDI spec is
        removed by devplug.

        Raises:
            SharingError: a daemon or a setting could not be undone (the kubelet retries).
        """
        await anyio.to_thread.run_sync(self.sharing.undo, claim.uid)
        if self.consumable_shares is not None:
            await anyio.to_thread.run_sync(self.share_configs.forget, claim.uid)

    async def release_device(self, name: str) -> None:
        """No claim uses device ``name`` any more. With consumable shares, undo what its claims
        left for the device as a whole, as NVIDIA does when a shared device's last claim goes:
        reset a GPU's time slice, destroy a dynamic MIG device.

        Raises:
            SharingError: the time slice could not be reset (the kubelet retries).
            DynamicMigError: the MIG device could not be destroyed (the kubelet retries).
        """
        if self.consumable_shares is None:
            return
        if self.dynamic_mig is not None and self.dynamic_mig.owns(name):
            await anyio.to_thread.run_sync(self.dynamic_mig.destroy, shared_key(name))
            return
        record = self._by_name.get(name)
        if record is not None and record.kind == "gpu":
            await anyio.to_thread.run_sync(self.sharing.release_gpu, record.uuid)


def serving_settings(settings: NvidiaSettings) -> NvidiaSettings:
    """``settings`` as the driver serves them: NVIDIA's driver name unless one is given, and
    with the gate ``DRAListTypeAttributes`` devplug's list attributes (NVIDIA then publishes
    ``resource.kubernetes.io/numaNode`` as a list)."""
    update: dict[str, object] = {}
    if settings.driver_name is None:
        update["driver_name"] = DRIVER_NAME
    if settings.gates[DRA_LIST_TYPE_ATTRIBUTES]:
        update["list_attributes"] = True
    return settings.model_copy(update=update) if update else settings


def run_dra(settings: NvidiaSettings, prog: str, *, started: Callable[[], object] | None = None) -> int:
    """``devplug-nvidia --api dra``: discovery, then serve until SIGTERM; the exit status
    (2: bad configuration, 1: discovery failed). ``started`` is called once discovery is done."""
    settings = serving_settings(settings)
    try:
        plugin = NvidiaDraPlugin.from_settings(settings)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except DevplugError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {os_error_text(exc)}", file=sys.stderr)
        return 1
    if started is not None:
        started()
    try:
        from devplug import run_async
        from devplug.dra import serve

        run_async(functools.partial(serve, plugin, settings))
    except Exception as exc:
        refusal = config_error_in(exc)
        if refusal is None:
            raise
        print(f"{prog}: {refusal}", file=sys.stderr)
        return 2
    return 0
