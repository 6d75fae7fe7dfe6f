"""The claims allocated devices of this driver's pool, followed from the API server.

A process serving both APIs must withhold a device from the device-plugin side from the moment
the scheduler writes the allocation, not only once the kubelet asks for the prepare (the pod may
wait for other resources first): this lists every ResourceClaim, then watches them, and tells
the :class:`~devplug._runtime.ledger.Ledger` which claims hold which of this pool's devices.
An outage changes nothing in the ledger (the devices stay withheld); the watch is listed again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from devplug._dra.allocation import AllocationError, parse_allocation
from devplug._dra.kube import KubeError
from devplug._runtime.backoff import Backoff

if TYPE_CHECKING:
    from devplug._dra.kube import Kube
    from devplug._runtime.ledger import Ledger

__all__ = ["devices_of", "follow_claims"]


def devices_of(claim: dict[str, Any], driver: str, pool: str) -> list[str]:
    """The device names the claim's allocation gives it from ``driver``'s ``pool`` (admin
    access, which takes nothing, left out); empty when it has none. A claim whose allocation is
    malformed (the prepare would refuse it) is read as holding nothing of this pool."""
    try:
        allocation = parse_allocation(claim)
    except AllocationError:
        return []
    if allocation is None:
        return []
    return [r.device for r in allocation.results_of(driver) if r.pool == pool and not r.admin_access]


def _identity(claim: dict[str, Any]) -> tuple[str, str] | None:
    metadata = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(metadata, dict) or not metadata.get("uid"):
        return None
    return str(metadata["uid"]), f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


async def follow_claims(kube: Kube, driver: str, pool: str, ledger: Ledger, log: Any) -> None:
    """List and watch every claim into ``ledger`` until cancelled."""
    backoff = Backoff(initial=0.2, maximum=30.0)
    failing = False
    while True:
        try:
            items, version = await kube.list_claims()
            held: dict[str, tuple[str, list[str]]] = {}
            for claim in items:
                identity, names = _identity(claim), devices_of(claim, driver, pool)
                if identity is not None and names:
                    held[identity[0]] = (identity[1], names)
            ledger.claims(held)
            if failing:
                log.info("claims_followed_again")
            failing = False
            backoff.reset()
            async for kind, obj in kube.watch_claims(version):
                identity = _identity(obj)
                if identity is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                names = devices_of(obj, driver, pool) if kind != "DELETED" else []
                ledger.claim(identity[0], identity[1], names or None)
        except KubeError as exc:
            if exc.status != 410 and not failing:  # 410: the watch fell behind; list again
                log.warning(
                    "claims_unavailable",
                    status=exc.status_label,
                    error=str(exc),
                    keeping="the devices of the claims known",
                )
                failing = True
        except Exception as exc:  # a malformed object, a bug: list and watch again
            log.exception("claims_unavailable", error=f"{type(exc).__name__}: {exc}")
            failing = True
        await anyio.sleep(backoff.next())
