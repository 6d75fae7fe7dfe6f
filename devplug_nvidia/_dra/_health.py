"""NVML health for the DRA driver: device taints as NVIDIA's DRA driver v0.4 publishes them, with
recovery.

:class:`DraHealthMonitor` is the device-plugin path's :class:`~devplug_nvidia._gpu._health.HealthMonitor`
(the same NVML event loop, the same XID verdicts and health policy) that also remembers what
happened to each device, as taints:

* a counted XID ``n``: ``<driver>/xid`` = ``n``, ``NoSchedule``. A recoverable one goes when the
  device is Healthy again (the GPU quiet for ``--health.recovery-cooldown``, the flap limiter
  on top); a fatal one (79, 48, ...) stays, and later XIDs do not change its value;
* an XID the filter ignores (13, 31, 43, 45, 68, 109, ``--additional-xids-to-ignore``):
  ``<driver>/xid`` = ``n``, effect ``None`` (informational: scheduling goes on), removed after
  the same quiet period. It never replaces a ``NoSchedule`` XID taint;
* a lost GPU: ``<driver>/gpu-lost``, ``NoSchedule``, for good;
* a GPU that supports no health events: ``<driver>/unmonitored``, effect ``None``;
* any other reason to be Unhealthy (an event wait failed, the checks could not start, an event
  on an unknown GPU): ``<driver>/unhealthy`` = the reason (``event_wait_failed``,
  ``check_not_running``...), ``NoSchedule``, gone with the reason.

The device's health (what the DRA health stream reports to the kubelet, and so
``allocatedResourcesStatus``) is the monitor's: Unhealthy exactly while a ``NoSchedule`` taint
stands.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from devplug._versioned import Versioned
from devplug.models import DeviceTaint, Health
from devplug_nvidia._gpu._health import _DBE_EVENT_TYPE as _DBE_TYPE
from devplug_nvidia._gpu._health import _XID_EVENT_TYPE as _XID_TYPE
from devplug_nvidia._gpu._health import HealthMonitor

if TYPE_CHECKING:
    from collections.abc import Iterable

    from devplug_nvidia._gpu._health import Registration, _Session, _Unit, _Wait
    from devplug_nvidia._gpu._model import GpuRecord

__all__ = [
    "HEALTH_GATE",
    "DraHealthMonitor",
    "MonitorTask",
    "additional_ignored",
    "dra_health_monitor",
    "health_enabled",
    "taint_keys",
]

log = structlog.get_logger("devplug_nvidia.dra_health")

_DBE_XID = 48


def taint_keys(driver: str) -> dict[str, str]:
    """The taint keys for ``driver``: ``xid``, ``gpu-lost``, ``unmonitored``, ``unhealthy``."""
    return {name: f"{driver}/{name}" for name in ("xid", "gpu-lost", "unmonitored", "unhealthy")}


class DraHealthMonitor(HealthMonitor):
    """Health and taints of every announced device (see the module docstring).

    Args:
        driver: the DRA driver name, the taint keys' prefix.
        *args, **kwargs: as for :class:`~devplug_nvidia._gpu._health.HealthMonitor`.
    """

    def __init__(self, *args: Any, driver: str, **kwargs: Any) -> None:
        self._keys = taint_keys(driver)
        self._xid: dict[str, int] = {}
        """Device UUID → the last counted XID (held while the device is Unhealthy)."""
        self._harmless: dict[str, tuple[int, float]] = {}
        """Device UUID → the last ignored XID and when it came."""
        self._lost: set[str] = set()
        self._unmonitored: set[str] = set()
        self._taints: dict[str, tuple[DeviceTaint, ...]] = {}
        self._watching = Versioned(False)
        """Whether a :meth:`run` watches now."""
        super().__init__(*args, **kwargs)
        self._cooldown = self._policy.settings.recovery_cooldown

    async def run(self) -> None:
        """Watch until cancelled, as the base class does. One NVML event set per monitor: a
        second caller waits while another one watches, and takes over when that one ends."""
        await self._watching.wait_for(lambda watching: None if watching else True)
        self._watching.set(True)
        try:
            await super().run()
        finally:
            self._watching.set(False)

    # -- what the plugin reads ----------------------------------------------------------------

    def taints(self, uuid: str) -> tuple[DeviceTaint, ...]:
        """The taints of the device with this UUID now (none when never observed)."""
        return self._taints.get(uuid, ())

    # -- what events do (the base class's hooks) -----------------------------------------------

    def _event(self, event: _Wait, now: float) -> None:
        if event.gpu is not None and event.event_type in (_XID_TYPE, _DBE_TYPE):
            xid = _DBE_XID if event.event_type == _DBE_TYPE else event.data
            if self.xids.verdict(xid) == "ignored":
                for unit in self._units_hit(event):
                    self._harmless[unit.uuid] = (xid, now)
        super()._event(event, now)

    def _fail(self, units: Iterable[_Unit], reason: str, now: float, *, fatal: bool) -> None:
        units = list(units)
        lowered = reason.lower()
        for unit in units:
            if unit.uuid in self._fatal and unit.uuid in self._xid:
                pass  # the XID that made the device fail for good stays its taint's value
            elif lowered.startswith("xid "):
                self._xid[unit.uuid] = int(reason.split()[1])
            elif lowered.startswith("double-bit ecc"):
                self._xid[unit.uuid] = _DBE_XID
            elif lowered.startswith("gpu lost"):
                self._lost.add(unit.uuid)
        super()._fail(units, reason, now, fatal=fatal)

    def _registered(self, session: _Session, outcomes: dict[str, Registration]) -> None:
        for gpu, (kind, _detail, _handle) in outcomes.items():
            for unit in self._by_gpu.get(gpu, []):
                if kind == "skipped":
                    self._unmonitored.add(unit.uuid)
                else:
                    self._unmonitored.discard(unit.uuid)
        super()._registered(session, outcomes)

    def _publish(self) -> None:
        now = self._clock()
        for uuid, (_xid, when) in list(self._harmless.items()):
            if now - when >= self._cooldown:
                del self._harmless[uuid]
        for uuid in list(self._xid):
            if self.health(uuid) is Health.HEALTHY:
                del self._xid[uuid]  # recovered: the quiet period is over
        taints = {uuid: t for uuid in self._units if (t := self._taints_of(uuid))}
        if taints != self._taints:
            changed = sorted(u for u in {*taints, *self._taints} if taints.get(u) != self._taints.get(u))
            self._taints = taints
            log.info(
                "device_taints_changed",
                devices={u: [_text(t) for t in taints.get(u, ())] for u in changed},
            )
            self._health.bump()
        super()._publish()

    # -- the taints ---------------------------------------------------------------------------------

    def _taints_of(self, uuid: str) -> tuple[DeviceTaint, ...]:
        keys = self._keys
        unhealthy = self.health(uuid) is Health.UNHEALTHY
        out: list[DeviceTaint] = []
        if uuid in self._lost:
            out.append(DeviceTaint(keys["gpu-lost"], "", "NoSchedule"))
        if unhealthy and uuid in self._xid:
            out.append(DeviceTaint(keys["xid"], str(self._xid[uuid]), "NoSchedule"))
        elif uuid in self._harmless:
            out.append(DeviceTaint(keys["xid"], str(self._harmless[uuid][0]), "None"))
        if uuid in self._unmonitored:
            out.append(DeviceTaint(keys["unmonitored"], "", "None"))
        if unhealthy and all(t.effect == "None" for t in out):
            out.append(DeviceTaint(keys["unhealthy"], self.reason_label(uuid), "NoSchedule"))
        return tuple(out)

    def _units_hit(self, event: _Wait) -> list[_Unit]:
        return [u for u in self._by_gpu.get(event.gpu or "", []) if u.hit_by(event.gi, event.ci)]


class MonitorTask:
    """``monitor.run()`` in a task of the event loop's own, not of a task group, started now.

    For a caller that cannot hold a task group open around it: the plugin's ``watch_devices``, an
    async generator, starts its monitor so that health works however the plugin is served
    (``devplug-nvidia --api dra``, ``devplug run``, a test's ``serving_dra``); a task group may not
    span the generator's ``yield``. :meth:`stop` ends the task (the generator's ``finally``). The
    runner is asyncio (devplug serves on anyio's asyncio backend).
    """

    def __init__(self, monitor: DraHealthMonitor) -> None:
        self.monitor = monitor
        self._task = asyncio.get_running_loop().create_task(monitor.run(), name="nvidia-dra-health")

    async def wait_changed(self, seen: int) -> int:
        """:meth:`DraHealthMonitor.wait_changed`, or what ended the monitor's run raised here
        (a bug: the run reports NVML trouble as health), so that the caller fails visibly."""
        waiter = asyncio.ensure_future(self.monitor.wait_changed(seen))
        try:
            await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if waiter.done() and not waiter.cancelled():
            return waiter.result()
        self._task.result()  # raises what ended the run
        raise RuntimeError("the NVML health monitor stopped")

    async def stop(self) -> None:
        """Cancel the run and wait until its NVML event set is closed."""
        self._task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({self._task})
        if not self._task.cancelled():
            self._task.exception()  # retrieved: the caller saw it in wait_changed


def _text(taint: DeviceTaint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


HEALTH_GATE = "NVMLDeviceHealthCheck"
"""NVIDIA's feature gate for NVML health checks in its DRA driver (alpha and off there)."""
DYNAMIC_MIG_GATE = "DynamicMIG"


def health_enabled(settings: Any) -> bool:
    """Whether the DRA driver watches NVML health: yes unless ``--feature-gates`` turns
    ``NVMLDeviceHealthCheck`` off explicitly (by name, or through ``AllAlpha=false``) or turns
    ``DynamicMIG`` on (NVIDIA refuses the two together: MIG devices come and go there).

    devplug's default differs from NVIDIA's, where the gate is off: a GPU that fails is tainted
    and recovers, rather than left schedulable. ``settings.feature_gates`` may be NVIDIA's text
    (``Name=true,Other=false``) or a mapping of gate → bool.
    """
    gates = getattr(settings, "feature_gates", None)
    if not gates:
        return True
    named = _named_gates(gates)
    if named.get(DYNAMIC_MIG_GATE) or (named.get("AllAlpha") and DYNAMIC_MIG_GATE not in named):
        return False
    if HEALTH_GATE in named:
        return named[HEALTH_GATE]
    return named.get("AllAlpha", True)


def _named_gates(gates: Any) -> dict[str, bool]:
    """The gates named explicitly, with their values (text values as Go's ParseBool reads them)."""
    if isinstance(gates, str):
        named: dict[str, bool] = {}
        for item in gates.split(","):
            name, _, value = item.partition("=")
            if name.strip():
                named[name.strip()] = value.strip() in ("1", "t", "T", "TRUE", "true", "True")
        return named
    if hasattr(gates, "items"):
        return {str(k): bool(v) for k, v in gates.items()}
    return {k: bool(v) for k, v in vars(gates).items()}


def additional_ignored(settings: Any) -> frozenset[int]:
    """``--additional-xids-to-ignore`` (a comma-separated string or a sequence of XIDs) read as
    NVIDIA reads it: items trimmed, anything that is not an unsigned integer skipped (NvidiaSettings
    refuses such an item before it gets here; other settings objects are read leniently)."""
    value = getattr(settings, "additional_xids_to_ignore", None)
    if not value:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return frozenset(int(i.strip()) for i in items if i.strip().isdigit() and i.strip().isascii())


def dra_health_monitor(
    settings: Any, records: Iterable[GpuRecord], driver: str, **kwargs: Any
) -> DraHealthMonitor | None:
    """The DRA driver's monitor over ``records`` for ``settings`` (an NvidiaSettings), or None
    when the feature gate turns health checks off or there is nothing to watch.

    Which XIDs count: as for the device plugin (``DP_DISABLE_HEALTHCHECKS``,
    ``DP_ENABLE_HEALTHCHECKS``, the config file's ``health`` section), plus
    ``--additional-xids-to-ignore``. ``kwargs``: passed to :class:`DraHealthMonitor`.
    """
    import os

    from devplug_nvidia._gpu._xids import XidFilter
    from devplug_nvidia.discovery import nvml_source

    records = list(records)
    if not records or not health_enabled(settings):
        return None
    xids = XidFilter.from_config(getattr(settings, "health_config", None), os.environ)
    extra = additional_ignored(settings)
    if extra and xids.disabled != "all":
        xids = replace(xids, disabled=xids.disabled | extra)
    source = nvml_source(settings)
    options: dict[str, Any] = {
        "module": source.module,
        # where this process sees the driver (in a container: the host's root mounted at
        # --driver-root-ctr-path), as discovery loads it; not the host's path
        "driver_root": source.driver_root,
        "settings": settings.health,
        "xids": xids,
        **kwargs,
    }
    return DraHealthMonitor(records, driver=driver, **options)
