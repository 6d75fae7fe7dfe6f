"""The driver's entries in its claims' ``status.devices`` (claim device status, GA in 1.37).

After a prepare the driver's devices of the claim that report something (a
:class:`~devplug.models.DeviceStatus` in the hook's answer) are written to the claim's status;
at unprepare they are removed. The writes happen beside the kubelet's calls, never in them: a
prepare never waits for the API server, and never fails for it.

A write reads the claim, replaces this driver's entries (other drivers' stay as they are) and
patches the status with the claim's resourceVersion as a precondition, so a concurrent writer
(the scheduler, another driver) is never overwritten: a conflict is read again at once. A claim
that is gone, or another claim by now (its UID), needs nothing. A refusal the same request would
meet again (422: the entries are invalid) is logged once and dropped; any other failure (403:
RBAC, 5xx, an unreachable server) is logged, naming the object, the verb and the status, and
retried with back-off, the newest wish for a claim replacing an older one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from devplug._dra.kube import KubeError
from devplug._runtime.backoff import Backoff

if TYPE_CHECKING:
    from devplug._dra.kube import Kube
    from devplug.models import ClaimRef

CONFLICT_RETRIES = 5
"""Conflicts answered by reading the claim again at once, before the back-off starts."""


@dataclass
class _Wish:
    ref: ClaimRef
    entries: list[dict[str, Any]]
    """This driver's entries the claim should have (empty: none)."""
    due: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, maximum=60.0))


class StatusWriter:
    """Writes this driver's ``status.devices`` entries of claims, in the background (:meth:`run`)."""

    def __init__(self, kube: Kube, driver: str, log: Any) -> None:
        self._kube = kube
        self.driver = driver
        self._log = log
        self._wishes: dict[str, _Wish] = {}
        self._wake = anyio.Event()
        self.writes = 0
        """Successful writes."""
        self.errors = 0
        """Failed attempts."""

    def publish(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Have the claim's entries of this driver be ``entries`` (complete API entries)."""
        self._wishes[ref.uid] = _Wish(ref, entries)
        self._wake.set()

    def withdraw(self, ref: ClaimRef) -> None:
        """Have the claim hold no entry of this driver."""
        self._wishes[ref.uid] = _Wish(ref, [])
        self._wake.set()

    def pending(self) -> int:
        """Claims whose status is still to be written."""
        return len(self._wishes)

    async def run(self) -> None:
        """Write until cancelled."""
        while True:
            now = anyio.current_time()
            due = [w for w in self._wishes.values() if w.due <= now]
            for wish in due:
                if self._wishes.get(wish.ref.uid) is not wish:
                    continue  # replaced by a newer wish meanwhile
                done = await self._attempt(wish)
                if done and self._wishes.get(wish.ref.uid) is wish:
                    del self._wishes[wish.ref.uid]
            if due:
                continue  # look again: a wish may have come, or one left due
            wait = min((w.due for w in self._wishes.values()), default=math.inf) - anyio.current_time()
            self._wake = anyio.Event()
            with anyio.move_on_after(max(wait, 0.0)):
                await self._wake.wait()

    async def _attempt(self, wish: _Wish) -> bool:
        """One write of ``wish``; True when nothing is left to do for it."""
        ref = wish.ref
        for _ in range(CONFLICT_RETRIES):
            try:
                return await self._write(wish)
            except KubeError as exc:
                if exc.status == 409:
                    continue
                return self._failed(wish, exc)
            except Exception as exc:  # not the API server's answer: logged, retried, never fatal
                self.errors += 1
                return self._retry_later(wish, "error", f"{type(exc).__name__}: {exc}", traceback=True)
        wish.due = anyio.current_time() + wish.backoff.next()
        self._log.warning(
            "claim_status_conflicts",
            object=f"resourceclaims/{ref.namespace}/{ref.name}",
            verb="patch",
            status=409,
            retries=CONFLICT_RETRIES,
        )
        return False

    async def _write(self, wish: _Wish) -> bool:
        ref = wish.ref
        obj = f"resourceclaims/{ref.namespace}/{ref.name}"
        try:
            claim = await self._kube.claim(ref.namespace, ref.name)
        except KubeError as exc:
            if exc.status == 404:
                self._log.debug("claim_status_not_needed", object=obj, reason="the claim is gone")
                return True
            raise
        metadata = claim.get("metadata") or {}
        if metadata.get("uid") != ref.uid:
            self._log.debug("claim_status_not_needed", object=obj, reason="the claim was replaced")
            return True
        current = list((claim.get("status") or {}).get("devices") or [])
        wanted = [d for d in current if d.get("driver") != self.driver] + wish.entries
        if _same(current, wanted):
            return True
        try:
            await self._kube.patch_claim_status(
                ref.namespace, ref.name, str(metadata.get("resourceVersion", "")), {"devices": wanted}
            )
        except KubeError as exc:
            if exc.status == 404:
                return True
            raise
        self.writes += 1
        self._log.info(
            "claim_status_written" if wish.entries else "claim_status_removed",
            object=obj,
            devices=[d.get("device") for d in wish.entries],
        )
        return True

    def _failed(self, wish: _Wish, exc: KubeError) -> bool:
        ref = wish.ref
        self.errors += 1
        obj = f"resourceclaims/{ref.namespace}/{ref.name}"
        if exc.status == 422:
            self._log.error(
                "claim_status_refused",
                object=obj,
                verb="patch",
                status=422,
                error=str(exc),
                note="not retried",
            )
            return True
        return self._retry_later(wish, exc.status_label, str(exc))

    def _retry_later(self, wish: _Wish, status: str, error: str, *, traceback: bool = False) -> bool:
        """Log a failed write (with the traceback of an unexpected error) and schedule the next
        try of ``wish`` after its back-off; False: something is left to do for it."""
        delay = wish.backoff.next()
        wish.due = anyio.current_time() + delay
        ref = wish.ref
        fields = {
            "object": f"resourceclaims/{ref.namespace}/{ref.name}/status",
            "verb": "patch",
            "status": status,
            "error": error,
            "retry_in": round(delay, 1),
        }
        if traceback:
            self._log.exception("claim_status_failed", **fields)
        else:
            self._log.warning("claim_status_failed", **fields)
        return False


def _same(current: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> bool:
    """Whether two ``status.devices`` lists hold the same entries (the order aside)."""

    def key(entry: dict[str, Any]) -> tuple[str, ...]:
        return tuple(str(entry.get(k) or "") for k in ("driver", "pool", "device", "shareID"))

    return sorted(current, key=key) == sorted(wanted, key=key)
