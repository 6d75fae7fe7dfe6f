"""Device health from NVML events: one monitor per process, read by every resource's plugin.

:class:`HealthMonitor` registers every physical GPU behind the discovered records for XID and
ECC events (only the types the GPU supports; a GPU that supports none, or answers NOT_SUPPORTED,
is skipped, not marked Unhealthy), then waits for events in a thread of its own with a short
timeout, so the event loop never blocks. A stop does not wait for that wait to time out: the
thread is a daemon, left to finish its wait and free the event set after, so SIGTERM ends the
process at once (a stop that joined the wait took up to ``wait_timeout``, 1 s).

What an event does, per device (a record: a full GPU or a MIG device):

* an XID reaches every device on that GPU, or only the MIG devices whose GPU- and
  compute-instance IDs match where the event names them (``0xFFFFFFFF``: any); a replica
  follows its device, since plugins look health up by the device's UUID;
* ignored XIDs (:mod:`devplug_nvidia._gpu._xids`) do nothing; fatal ones (fallen off the bus, 79;
  double-bit ECC, 48; ...) and a lost GPU mark the device Unhealthy for good; any other
  counted XID marks it Unhealthy until the GPU has been quiet for the health policy's
  ``recovery_cooldown`` (``--health.recovery-cooldown``), with devplug's flap limiter on top;
* a double-bit ECC event counts as XID 48; a single-bit one (corrected) is only logged;
* a wait that fails with anything but a timeout marks every device Unhealthy, as upstream does
  (recoverable: GPUs that answer GPU_IS_LOST afterwards are fatal), and waiting goes on.

If the monitor cannot start (NVML, the event set, or a GPU's registration fails), the devices
concerned are reported Unhealthy with the reason logged, and the start is retried: a node never
looks healthy while nothing watches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import structlog

from devplug._versioned import Versioned
from devplug.health import HealthPolicy, HealthSettings, Signal
from devplug.metrics import event_counter
from devplug.models import Health
from devplug_nvidia._gpu import _nvml
from devplug_nvidia._gpu._nvml import Nvml, NvmlError
from devplug_nvidia._gpu._xids import XidFilter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path

    from devplug_nvidia._gpu._model import GpuRecord

__all__ = ["WHOLE_GPU", "XID_EVENTS", "HealthMonitor"]

log = structlog.get_logger("devplug_nvidia.health")

WHOLE_GPU = 0xFFFFFFFF
"""The GPU- / compute-instance ID of an event that concerns the whole GPU."""

XID_EVENTS = event_counter(
    "devplug_nvidia_xid_events_total",
    "XID events (double-bit ECC: 48) reported by NVML, by code and verdict (recoverable, fatal, ignored).",
    ("xid", "verdict"),
)

_XID_EVENT = "nvmlEventTypeXidCriticalError"
_DBE_EVENT = "nvmlEventTypeDoubleBitEccError"
_SBE_EVENT = "nvmlEventTypeSingleBitEccError"
_EVENT_CONSTANTS = {
    "EventTypeXidCriticalError": _XID_EVENT,
    "EventTypeDoubleBitEccError": _DBE_EVENT,
    "EventTypeSingleBitEccError": _SBE_EVENT,
}
_DBE_XID = 48
_REOPEN_AFTER = 5
"""Consecutive failed waits after which the event set is thrown away and made again."""


@dataclass(frozen=True)
class _Unit:
    """One device whose health is tracked: a record, placed on its physical GPU."""

    uuid: str
    gpu: str
    gi: int | None = None
    ci: int | None = None

    def hit_by(self, gi: int, ci: int) -> bool:
        """Whether an event for GPU instance ``gi`` / compute instance ``ci`` concerns it."""
        if self.gi is None or self.ci is None:
            return True  # a full GPU holds every instance on it
        return gi in (WHOLE_GPU, self.gi) and ci in (WHOLE_GPU, self.ci)


@dataclass(frozen=True)
class _Wait:
    """What one ``nvmlEventSetWait`` brought back."""

    kind: Literal["timeout", "event", "error"]
    gpu: str | None = None
    event_type: int = 0
    data: int = 0
    gi: int = WHOLE_GPU
    ci: int = WHOLE_GPU
    error: str = ""
    lost: tuple[str, ...] = ()


@dataclass
class _Session:
    """An open NVML with one event set."""

    nvml: Nvml
    event_set: Any
    types: dict[str, int]
    handles: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    waiting: bool = False
    """A wait's thread is inside nvmlEventSetWait: the event set is not to be freed under it."""
    closing: bool = False
    """The monitor stopped: the thread of a wait still running closes the session when it returns."""


Registration = tuple[Literal["ok", "skipped", "lost", "failed"], str, Any]


class HealthMonitor:
    """Health of every discovered device, kept from NVML events (see the module docstring).

    Run :meth:`run` in a task for as long as the plugins serve; plugins read :meth:`health` and
    wait on :meth:`wait_changed`.

    Args:
        records: every record of every resource (replicas are not records).
        module: ``pynvml`` or a fake; None imports ``pynvml``.
        driver_root: where the driver's library is (as for discovery).
        settings: the health policy; its ``recovery_cooldown`` is the quiet period after a
            recoverable XID, and its flap limiter applies. A single event is enough to mark a
            device Unhealthy whatever ``unhealthy_after`` says.
        xids: which XIDs count (default: upstream's defaults, no environment).
        wait_timeout: seconds one ``nvmlEventSetWait`` may block (upstream: 5); also how long
            cancellation may take.
        retry_interval: seconds between attempts to start a failed monitor or registration.
        clock: monotonic seconds (default: the event loop's clock).
    """

    def __init__(
        self,
        records: Iterable[GpuRecord],
        *,
        module: Any = None,
        driver_root: str | Path | None = None,
        settings: HealthSettings | None = None,
        xids: XidFilter | None = None,
        wait_timeout: float = 1.0,
        retry_interval: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.xids = xids or XidFilter()
        self.wait_timeout = wait_timeout
        self.retry_interval = retry_interval
        self._module = module
        self._driver_root = driver_root
        self._clock = clock or anyio.current_time
        base = settings or HealthSettings()
        # Events report failures only: one is enough, and silence is the good check.
        self._policy = HealthPolicy(
            base.model_copy(update={"unhealthy_after": 1, "healthy_after": 1, "result_ttl": None}), log=log
        )
        self._units: dict[str, _Unit] = {}
        self._by_gpu: dict[str, list[_Unit]] = {}
        for record in records:
            mig = record.mig
            unit = (
                _Unit(record.uuid, mig.parent_uuid, mig.gpu_instance_id, mig.compute_instance_id)
                if mig is not None
                else _Unit(record.uuid, record.uuid)
            )
            if unit.uuid not in self._units:
                self._units[unit.uuid] = unit
                self._by_gpu.setdefault(unit.gpu, []).append(unit)
        self._fatal: dict[str, str] = {}
        self._pending: dict[str, str] = {}
        """GPU UUID → why its registration failed (retried)."""
        self._labels: dict[str, str] = {}
        self._health = Versioned(self._health_map())
        """Every device's health; a new version whenever some device's changes."""
        self._started = Versioned(False)

    # -- what plugins read --------------------------------------------------------------------

    def health(self, uuid: str) -> Health:
        """The health to report for the device with this UUID (Healthy when never observed)."""
        if uuid in self._fatal:
            return Health.UNHEALTHY
        return self._policy.health(uuid) or Health.HEALTHY

    def reason_label(self, uuid: str) -> str:
        """Why the device has its health now, as a metric label: what failed it last while it is
        Unhealthy (``xid``, ``ecc``, ``gpu_lost``, ``event_wait_failed``, ...), else ``recovered``."""
        if self.health(uuid) is Health.HEALTHY:
            return "recovered"
        return self._labels.get(uuid, "unspecified")

    def health_message(self, uuid: str) -> str:
        """Why the device is Unhealthy, in a sentence (what failed it, and how the policy
        judged it); empty while it is Healthy."""
        if uuid in self._fatal:
            return self._fatal[uuid]
        if self.health(uuid) is Health.HEALTHY:
            return ""
        return self._policy.reason(uuid)

    def fatal_reason(self, uuid: str) -> str | None:
        """Why the device is Unhealthy for good, or None."""
        return self._fatal.get(uuid)

    @property
    def version(self) -> int:
        """Bumped whenever the health of some device changes."""
        return self._health.version

    async def wait_changed(self, seen: int) -> int:
        """Wait until :attr:`version` is past ``seen`` (a version read before); returns the new version."""
        await self._health.newer_than(seen)
        return self._health.version

    async def wait_started(self) -> None:
        """Wait until the first start attempt is over (events registered, or the failure noted)."""
        await self._started.wait_for(lambda started: started or None)

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch until cancelled. Never raises for NVML trouble: it is reported as health."""
        if not self._units:
            self._set_started()
            await anyio.sleep_forever()
        if self.xids.checks_off:
            log.warning("health_checks_disabled", reason="DP_DISABLE_HEALTHCHECKS", devices=len(self._units))
            self._set_started()
            await anyio.sleep_forever()
        log.info("health_checks", devices=len(self._units), gpus=len(self._by_gpu), **self.xids.describe())
        while True:
            try:
                session, outcomes = await anyio.to_thread.run_sync(self._open)
            except Exception as exc:  # whatever stops the start is reported as health
                error = str(exc) if isinstance(exc, NvmlError) else f"{type(exc).__name__}: {exc}"
                self._start_failed(list(self._units.values()), error)
                self._set_started()
                await anyio.sleep(self.retry_interval)
                continue
            try:
                self._registered(session, outcomes)
                self._set_started()
                await self._watch(session)
            finally:
                with session.lock:
                    session.closing = True
                    waiting = session.waiting
                if not waiting:  # else the wait's thread closes it once its wait returns
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._close, session)

    async def _watch(self, session: _Session) -> None:
        """Wait for events until too many waits in a row fail (then the caller starts over)."""
        failures = 0
        next_retry = self._clock() + self.retry_interval
        while True:
            timeout = self.wait_timeout
            deadline = self._policy.next_deadline()
            if deadline is not None:
                timeout = min(timeout, max(0.01, deadline - self._clock()))
            outcome = await self._wait(session, math.ceil(timeout * 1000))
            now = self._clock()
            if outcome.kind == "event":
                self._event(outcome, now)
            elif outcome.kind == "error":
                self._wait_failed(outcome, now)
            self._policy.tick(now)
            self._publish()
            if self._pending and now >= next_retry:
                outcomes = await anyio.to_thread.run_sync(self._register_all, session, list(self._pending))
                self._registered(session, outcomes)
                next_retry = now + self.retry_interval
            if outcome.kind != "error":
                failures = 0
                continue
            failures += 1
            if failures >= _REOPEN_AFTER:
                log.warning("event_set_reopened", failures=failures)
                return
            await anyio.sleep(min(self.wait_timeout * 2 ** (failures - 1), 30.0))

    # -- what events do -------------------------------------------------------------------------

    def _event(self, event: _Wait, now: float) -> None:
        if event.gpu is None:
            # Upstream's rule: an event whose GPU cannot be told concerns every device.
            why = f"event on an unidentified GPU ({event.error})"
            log.warning("health_event_unattributed", error=event.error, devices=len(self._units))
            self._fail(self._units.values(), why, now, fatal=False)
            return
        units = [u for u in self._by_gpu.get(event.gpu, []) if u.hit_by(event.gi, event.ci)]
        if not units:
            log.debug(
                "health_event_unmatched", gpu=event.gpu, gpu_instance=event.gi, compute_instance=event.ci
            )
            return
        if event.event_type == _SBE_EVENT_TYPE:
            log.info("ecc_single_bit", gpu=event.gpu, note="corrected by the GPU; not counted")
            return
        xid = _DBE_XID if event.event_type == _DBE_EVENT_TYPE else event.data
        kind = "double-bit ECC error" if event.event_type == _DBE_EVENT_TYPE else f"XID {xid}"
        verdict = self.xids.verdict(xid)
        XID_EVENTS.inc(xid, verdict)
        if verdict == "ignored":
            log.info("xid_ignored", xid=xid, gpu=event.gpu)
            return
        log.warning(
            "xid",
            xid=xid,
            gpu=event.gpu,
            gpu_instance=_id_text(event.gi),
            compute_instance=_id_text(event.ci),
            devices=[u.uuid for u in units],
            fatal=verdict == "fatal",
        )
        self._fail(units, kind, now, fatal=verdict == "fatal")

    def _wait_failed(self, event: _Wait, now: float) -> None:
        log.warning("event_wait_failed", error=event.error, devices=len(self._units), lost=list(event.lost))
        self._fail(self._units.values(), f"event wait failed: {event.error}", now, fatal=False)
        for gpu in event.lost:
            self._fail(self._by_gpu.get(gpu, []), "GPU lost (fallen off the bus)", now, fatal=True)

    def _fail(self, units: Iterable[_Unit], reason: str, now: float, *, fatal: bool) -> None:
        label = _reason_label(reason)
        for unit in units:
            self._labels[unit.uuid] = label
            if fatal:
                self._fatal.setdefault(unit.uuid, reason)
            self._policy.observe(unit.uuid, Signal.FAIL, now, reason=reason)
            if not fatal:
                # The quiet period starts now: silence from here on is the good check.
                self._policy.observe(unit.uuid, Signal.OK, now)

    def _start_failed(self, units: Sequence[_Unit], error: str) -> None:
        now = self._clock()
        log.error(
            "health_check_start_failed",
            error=error,
            devices=[u.uuid for u in units],
            marked="Unhealthy",
            retry_in=self.retry_interval,
        )
        for unit in units:
            self._labels[unit.uuid] = "check_not_running"
            # No good check follows: the devices stay Unhealthy until a start succeeds.
            self._policy.observe(unit.uuid, Signal.FAIL, now, reason=f"health check not running: {error}")
        self._publish()

    def _registered(self, session: _Session, outcomes: dict[str, Registration]) -> None:
        now = self._clock()
        failed: list[_Unit] = []
        reasons = []
        for gpu, (kind, detail, handle) in outcomes.items():
            units = self._by_gpu.get(gpu, [])
            if kind == "ok":
                session.handles[gpu] = handle
                self._pending.pop(gpu, None)
                for unit in units:
                    self._policy.observe(unit.uuid, Signal.OK, now)
            elif kind == "skipped":
                self._pending.pop(gpu, None)
                log.warning("health_events_not_supported", gpu=gpu, reason=detail, devices=len(units))
            elif kind == "lost":
                self._pending.pop(gpu, None)
                self._fail(units, "GPU lost (fallen off the bus)", now, fatal=True)
            else:
                self._pending[gpu] = detail
                failed.extend(units)
                reasons.append(f"{gpu}: {detail}")
        if failed:
            self._start_failed(failed, "; ".join(reasons))
        log.info(
            "health_check_started",
            watched=len(session.handles),
            skipped=sum(1 for k, _, _ in outcomes.values() if k == "skipped"),
            failed=len(self._pending),
        )
        self._publish()

    # -- change notification ----------------------------------------------------------------------

    def _health_map(self) -> dict[str, Health]:
        return {uuid: self.health(uuid) for uuid in self._units}

    def _publish(self) -> None:
        snapshot = self._health_map()
        if snapshot != self._health.value:
            self._health.set(snapshot)

    def _set_started(self) -> None:
        if not self._started.value:
            self._started.set(True)

    # -- NVML, in worker threads ------------------------------------------------------------------

    def _open(self) -> tuple[_Session, dict[str, Registration]]:
        nvml = Nvml.open(self._module, driver_root=self._driver_root)
        try:
            types = {name: nvml.const(name) for name in (_XID_EVENT, _DBE_EVENT, _SBE_EVENT)}
            session = _Session(nvml, nvml.call("nvmlEventSetCreate"), types)
        except BaseException:
            nvml.close()
            raise
        return session, self._register_all(session, list(self._by_gpu))

    def _register_all(self, session: _Session, gpus: Sequence[str]) -> dict[str, Registration]:
        return {gpu: self._register(session, gpu) for gpu in gpus}

    def _register(self, session: _Session, gpu: str) -> Registration:
        nvml = session.nvml
        mask = 0
        for name in self.xids.event_types:
            mask |= session.types[_EVENT_CONSTANTS[name]]
        try:
            handle = nvml.call("nvmlDeviceGetHandleByUUID", gpu)
            supported = int(nvml.call("nvmlDeviceGetSupportedEventTypes", handle)) & mask
            if not supported:
                return "skipped", "supports none of the XID and ECC events", None
            nvml.call("nvmlDeviceRegisterEvents", handle, supported, session.event_set)
        except NvmlError as exc:
            if exc.code in (_nvml.NOT_SUPPORTED, _nvml.FUNCTION_NOT_FOUND):
                return "skipped", "event registration not supported (too old for health checks)", None
            if exc.code == _nvml.GPU_IS_LOST:
                return "lost", str(exc), None
            return "failed", str(exc), None
        return "ok", "", handle

    async def _wait(self, session: _Session, timeout_ms: int) -> _Wait:
        """One nvmlEventSetWait in a daemon thread, abandoned when the task is cancelled.

        anyio's worker threads are joined at interpreter exit and a cancelled ``run_sync`` waits
        for its call, so a stop would wait for NVML's timeout. Here the cancelled task returns at
        once and the thread, when the wait returns, closes the session (:attr:`_Session.closing`);
        at process exit the daemon thread is not waited for. Freeing the event set under a
        running wait to wake it is not done: NVML does not say that is safe.
        """
        loop = asyncio.get_running_loop()
        done = anyio.Event()
        result: list[_Wait | BaseException] = []

        def wait() -> None:
            try:
                result.append(self._wait_once(session, timeout_ms))
            except BaseException as exc:  # handed to the task, raised there
                result.append(exc)
            with session.lock:
                session.waiting = False
                close = session.closing
            if close:
                self._close(session)
                return
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(done.set)

        with session.lock:
            session.waiting = True
        threading.Thread(target=wait, name="nvml-event-wait", daemon=True).start()
        await done.wait()
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    @staticmethod
    def _wait_once(session: _Session, timeout_ms: int) -> _Wait:
        nvml = session.nvml
        try:
            data = nvml.call("nvmlEventSetWait", session.event_set, timeout_ms)
        except NvmlError as exc:
            if exc.code == _nvml.TIMEOUT:
                return _Wait("timeout")
            lost = tuple(gpu for gpu, handle in session.handles.items() if _is_lost(nvml, handle))
            return _Wait("error", error=str(exc), lost=lost)
        kind = int(data.eventType)
        event_type = (
            _DBE_EVENT_TYPE
            if kind == session.types[_DBE_EVENT]
            else _SBE_EVENT_TYPE
            if kind == session.types[_SBE_EVENT]
            else _XID_EVENT_TYPE
            if kind == session.types[_XID_EVENT]
            else 0
        )
        if not event_type:
            return _Wait("timeout")  # not a health event: nothing to do
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        try:
            gpu = _text(nvml.call("nvmlDeviceGetUUID", data.device))
        except NvmlError as exc:
            return _Wait("event", None, event_type, int(data.eventData), gi, ci, error=str(exc))
        return _Wait("event", gpu, event_type, int(data.eventData), gi, ci)

    @staticmethod
    def _close(session: _Session) -> None:
        try:
            session.nvml.call("nvmlEventSetFree", session.event_set)
        except NvmlError as exc:
            log.debug("event_set_free_failed", error=str(exc))
        session.nvml.close()


# Event kinds after translation from the module's constants (those differ only in name).
_XID_EVENT_TYPE, _DBE_EVENT_TYPE, _SBE_EVENT_TYPE = 1, 2, 3


def _is_lost(nvml: Nvml, handle: Any) -> bool:
    try:
        nvml.call("nvmlDeviceGetMemoryInfo", handle)
    except NvmlError as exc:
        return exc.code == _nvml.GPU_IS_LOST
    return False


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _id_text(value: int) -> int | str:
    return "all" if value == WHOLE_GPU else value


def _reason_label(reason: str) -> str:
    """A fixed word for a failure reason (metric labels must not carry free text)."""
    lowered = reason.lower()
    for prefix, label in (
        ("xid", "xid"),
        ("double-bit ecc", "ecc"),
        ("gpu lost", "gpu_lost"),
        ("event wait failed", "event_wait_failed"),
        ("event on an unidentified gpu", "event_unattributed"),
        ("health check not running", "check_not_running"),
    ):
        if lowered.startswith(prefix):
            return label
    return "unspecified"
