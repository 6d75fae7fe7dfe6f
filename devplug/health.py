"""Health policy: what the kubelet is told, decided from a plugin's raw check results.

A raw check is noisy: a driver call times out once, a counter blips, a device recovers for a
second and fails again. Reporting each result as is makes the kubelet flap a device's
allocatable count (and, with one-way health, never recover). :class:`HealthPolicy` sits in
between, per device:

* a Healthy device becomes Unhealthy after ``unhealthy_after`` consecutive failed checks;
* an Unhealthy device becomes Healthy after ``healthy_after`` consecutive good checks spread
  over at least ``recovery_cooldown`` seconds;
* an *unknown* result (the check could not tell) is not a failure: the device keeps its
  reported health until it has been unknown for ``unknown_timeout`` seconds;
* a device whose reported health changed more than ``flap_limit`` times within
  ``flap_window`` seconds is held Unhealthy until it has checked good for ``flap_hold``
  seconds without a break.

A device's very first result is reported as is: there is nothing to smooth yet. The policy is
a state machine with the clock passed in (``now``, in seconds, any monotonic origin), so it is
deterministic and testable; it does no I/O besides logging each change with its reason. For a
polling plugin, :func:`poll` wraps a check function into a ``watch_devices`` generator.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from pydantic import BaseModel, ConfigDict, Field

from devplug._text import counted
from devplug.models import Device, Health

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence

__all__ = ["HealthPolicy", "HealthSettings", "Signal", "Transition", "poll"]


class HealthSettings(BaseModel):
    """The knobs of :class:`HealthPolicy` (``health:`` in a config file, ``--health.*`` flags)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    unhealthy_after: int = Field(default=3, ge=1)
    """Consecutive failed checks before a Healthy device is reported Unhealthy."""
    healthy_after: int = Field(default=2, ge=1)
    """Consecutive good checks before an Unhealthy device is reported Healthy again."""
    recovery_cooldown: float = Field(default=30.0, ge=0)
    """Seconds from the first of those good checks before Healthy again (0: the count alone)."""
    unknown_timeout: float = Field(default=60.0, ge=0)
    """Seconds a device may stay unknown (its check could not tell) before it is reported
    Unhealthy; until then it keeps its reported health."""
    result_ttl: float | None = Field(default=None, gt=0)
    """Seconds a check result stays valid; a device with no newer one turns unknown. Unset:
    results never expire (checks that report only on change)."""
    flap_limit: int | None = Field(default=4, ge=1)
    """Changes of reported health allowed within flap_window; one more holds the device
    Unhealthy. Unset: no flap limiter."""
    flap_window: float = Field(default=600.0, gt=0)
    """Seconds over which changes of reported health are counted."""
    flap_hold: float = Field(default=600.0, ge=0)
    """Seconds of unbroken good checks a held (flapping) device needs before Healthy again
    (recovery_cooldown if that is longer)."""


class Signal(str, enum.Enum):
    """One raw check result."""

    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, value: Signal | Health | bool | None) -> Signal:
        """OK for True / Healthy, FAIL for False / Unhealthy, UNKNOWN for None."""
        if isinstance(value, Signal):
            return value
        if value is None:
            return cls.UNKNOWN
        if isinstance(value, Health):
            return cls.OK if value is Health.HEALTHY else cls.FAIL
        return cls.OK if value else cls.FAIL


@dataclass(frozen=True)
class Transition:
    """A change of the health reported for one device."""

    device: str
    health: Health
    reason: str
    at: float


@dataclass
class _Tracker:
    """The policy's memory of one device."""

    health: Health
    fails: int = 0
    oks: int = 0
    ok_since: float | None = None
    unknown_since: float | None = None
    last_result_at: float = 0.0
    held: bool = False
    flips: deque[float] = field(default_factory=deque)
    reason: str = ""
    """Why the device has its health: the reason of its last change."""


class HealthPolicy:
    """Per-device health decided from raw check results; see the module docstring.

    Args:
        settings: the thresholds; the defaults are safe for a check run every few seconds.
        log: where transitions are logged (default: the ``devplug.health`` logger).
    """

    def __init__(self, settings: HealthSettings | None = None, *, log: Any = None) -> None:
        self.settings = settings or HealthSettings()
        self._log = log if log is not None else structlog.get_logger("devplug.health")
        self._devices: dict[str, _Tracker] = {}
        self._now = -math.inf

    def health(self, device_id: str) -> Health | None:
        """The health reported for ``device_id`` now; None for a device never observed."""
        tracker = self._devices.get(device_id)
        return tracker.health if tracker is not None else None

    def reason(self, device_id: str) -> str:
        """Why ``device_id`` has the health reported now: the reason of its last change (with
        the check's own after ``last:``); empty for a device never changed or observed."""
        tracker = self._devices.get(device_id)
        return tracker.reason if tracker is not None else ""

    def observe(
        self, device_id: str, result: Signal | Health | bool | None, now: float, *, reason: str | None = None
    ) -> Health:
        """Record one check result for ``device_id`` at ``now``; return the health to report.

        ``reason`` (e.g. ``"XID 79"``) is added to the log of a change it causes.
        """
        now = self._clock(now)
        signal = Signal.of(result)
        tracker = self._devices.get(device_id)
        if tracker is None:
            # The first result is reported as is: there is nothing to smooth yet.
            tracker = self._devices[device_id] = _Tracker(health=Health.HEALTHY, last_result_at=now)
            if signal is Signal.FAIL:
                self._change(
                    device_id, tracker, Health.UNHEALTHY, _because("first check failed", reason), now
                )
            elif signal is Signal.OK:
                tracker.oks, tracker.ok_since = 1, now
            else:
                tracker.unknown_since = now
            return tracker.health
        tracker.last_result_at = now
        if signal is Signal.UNKNOWN:
            # Not a failure, but no proof of health either: a recovery in progress starts over.
            tracker.oks, tracker.ok_since = 0, None
            if tracker.unknown_since is None:
                tracker.unknown_since = now
        elif signal is Signal.FAIL:
            tracker.unknown_since = None
            tracker.fails += 1
            tracker.oks, tracker.ok_since = 0, None
        else:
            tracker.unknown_since = None
            tracker.fails = 0
            tracker.oks += 1
            if tracker.ok_since is None:
                tracker.ok_since = now
        self._evaluate(device_id, tracker, now, reason)
        return tracker.health

    def tick(self, now: float) -> list[Transition]:
        """Apply what time alone decides (cool-downs, unknown timeouts, expired results)."""
        now = self._clock(now)
        changes = []
        for device_id, tracker in self._devices.items():
            change = self._evaluate(device_id, tracker, now, None)
            if change is not None:
                changes.append(change)
        return changes

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`tick` could change something; None for never."""
        s = self.settings
        times: list[float] = []
        for t in self._devices.values():
            unknown = self._unknown_since(t)
            if unknown is None and s.result_ttl is not None:
                times.append(t.last_result_at + s.result_ttl)
            if t.health is Health.HEALTHY and unknown is not None:
                times.append(unknown + s.unknown_timeout)
            if t.health is Health.UNHEALTHY and t.ok_since is not None and t.oks >= s.healthy_after:
                hold = max(s.flap_hold, s.recovery_cooldown) if t.held else s.recovery_cooldown
                times.append(t.ok_since + hold)
        # A deadline already passed means the next tick changes something (each rule's
        # change removes its own deadline), so report it as due now rather than never.
        return max(min(times), self._now) if times else None

    def update(self, devices: Iterable[Device], now: float, *, unknown: Collection[str] = ()) -> list[Device]:
        """Observe a full device list and return it with the health to report.

        Each device's ``health`` is its raw result (IDs in ``unknown``: the check could not
        tell). Devices missing from the list are forgotten, so one that comes back starts over.
        """
        devices = list(devices)
        for device in devices:
            result = None if device.id in unknown else device.health
            self.observe(device.id, result, now, reason=device.health_message or None)
        present = {d.id for d in devices}
        for gone in [i for i in self._devices if i not in present]:
            del self._devices[gone]
        return self.reported(devices, now)

    def reported(self, devices: Iterable[Device], now: float) -> list[Device]:
        """``devices`` with the health to report at ``now``, recording no new results."""
        self.tick(now)
        result = []
        for device in devices:
            tracker = self._devices.get(device.id)
            if tracker is None:
                result.append(device)
            elif tracker.health is Health.UNHEALTHY:
                # Why it is reported Unhealthy: the policy's reason, with the check's own.
                result.append(device.with_health(Health.UNHEALTHY, tracker.reason))
            elif device.health is not Health.HEALTHY:
                result.append(device.with_health(Health.HEALTHY))  # a failure not acted on (yet)
            else:
                result.append(device)
        return result

    # -- the rules ---------------------------------------------------------------------------

    def _clock(self, now: float) -> float:
        # A clock that steps back (a caller mixing clocks) must not undo decisions.
        self._now = max(self._now, now)
        return self._now

    def _unknown_since(self, t: _Tracker) -> float | None:
        ttl = self.settings.result_ttl
        if t.unknown_since is not None:
            return t.unknown_since
        if ttl is not None and self._now >= t.last_result_at + ttl:
            return t.last_result_at + ttl
        return None

    def _evaluate(self, device_id: str, t: _Tracker, now: float, reason: str | None) -> Transition | None:
        unknown = self._unknown_since(t)
        if unknown is not None and t.unknown_since is None:
            t.oks, t.ok_since = 0, None  # an expired result: as if the check said unknown
            t.unknown_since = unknown
        if t.health is Health.HEALTHY:
            why = self._failure(t, now, unknown)
            health = Health.UNHEALTHY
        else:
            why = self._recovery(t, now)
            health = Health.HEALTHY
        if why is None:
            return None
        return self._change(device_id, t, health, _because(why, reason), now)

    def _failure(self, t: _Tracker, now: float, unknown: float | None) -> str | None:
        """Why a Healthy device is now Unhealthy, or None."""
        s = self.settings
        if t.fails >= s.unhealthy_after:
            return "a failed check" if t.fails == 1 else f"{t.fails} consecutive failed checks"
        if unknown is not None and now - unknown >= s.unknown_timeout:
            return f"unknown for {now - unknown:g}s"
        return None

    def _recovery(self, t: _Tracker, now: float) -> str | None:
        """Why an Unhealthy device is now Healthy, or None."""
        s = self.settings
        if t.ok_since is None or t.oks < s.healthy_after:
            return None
        stable = now - t.ok_since
        if t.held:
            if stable < max(s.flap_hold, s.recovery_cooldown):
                return None
            t.held = False
            t.flips.clear()
            return f"good for {stable:g}s after flapping"
        if stable < s.recovery_cooldown:
            return None
        checks = "a good check" if t.oks == 1 else f"{t.oks} consecutive good checks"
        return f"{checks} over {stable:g}s"

    def _change(
        self, device_id: str, t: _Tracker, health: Health, reason: str, now: float
    ) -> Transition | None:
        """Report ``health`` from now on, unless the flap limiter holds the device Unhealthy."""
        s = self.settings
        while t.flips and t.flips[0] <= now - s.flap_window:
            t.flips.popleft()
        if s.flap_limit is not None and not t.held and len(t.flips) + 1 > s.flap_limit:
            t.held = True
            note = (
                f"flapping ({counted(len(t.flips) + 1, 'change')} in {s.flap_window:g}s): "
                f"held Unhealthy until good for {s.flap_hold:g}s"
            )
            if health is Health.HEALTHY:
                self._log.warning("health_held", device=device_id, reason=f"{reason}; {note}")
                return None
            reason = f"{reason}; {note}"
        t.flips.append(now)
        t.health = health
        t.reason = reason
        if health is Health.UNHEALTHY:
            t.fails = 0
        self._log.info("health_changed", device=device_id, health=health.value, reason=reason)
        return Transition(device_id, health, reason, now)


def _because(why: str, detail: str | None) -> str:
    return f"{why} (last: {detail})" if detail else why


async def poll(
    check: Callable[[], Awaitable[Sequence[Device]]],
    *,
    interval: float,
    policy: HealthPolicy | None = None,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[list[Device]]:
    """A ``watch_devices`` generator: run ``check`` every ``interval`` seconds through ``policy``.

    ``check`` returns the full device list with each device's raw health. If it raises, the
    error is logged and every known device counts as unknown for that round. Between checks
    the generator also wakes when the policy has a time-based change due (a cool-down ending).

    Use it as ``def watch_devices(self): return health.poll(self.check, interval=5.0)``.
    """
    policy = policy or HealthPolicy()
    now_of = clock or anyio.current_time
    log = structlog.get_logger("devplug.health")
    devices: list[Device] = []
    next_check = now_of()
    while True:
        now = now_of()
        if now >= next_check:
            try:
                devices = list(await check())
                unknown: Collection[str] = ()
            except Exception as exc:
                log.warning("health_check_failed", error=str(exc), devices=len(devices))
                unknown = {d.id for d in devices}
            now = now_of()
            yield policy.update(devices, now, unknown=unknown)
            next_check = now + interval
        else:
            yield policy.reported(devices, now)
        deadline = min(next_check, policy.next_deadline() or math.inf)
        await anyio.sleep(max(0.0, deadline - now_of()))
