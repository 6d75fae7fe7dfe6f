"""Which devices of this driver's pool a claim holds, as the claim watch reads it from the API
server's objects (any namespace, any driver's claims, some malformed)."""

from __future__ import annotations

from typing import Any

from devplug._dra.claim_watch import devices_of

DRIVER, POOL = "gpu.example.com", "node-1"


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "c"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, *, driver: str = DRIVER, pool: str = POOL, **more: Any) -> dict[str, Any]:
    return {"request": "r", "driver": driver, "pool": pool, "device": device, **more}


def test_only_this_driver_s_devices_of_this_pool_and_not_admin_access() -> None:
    held = claim(
        result("gpu-0"),
        result("gpu-1", pool="node-2"),
        result("nic-0", driver="nic.example.com"),
        result("gpu-2", adminAccess=True),
        result("gpu-3", shareID="5c8f2d4e-1a3b-4c5d-8e9f-0a1b2c3d4e5f"),
    )
    assert devices_of(held, DRIVER, POOL) == ["gpu-0", "gpu-3"]


def test_an_unallocated_or_malformed_claim_holds_nothing() -> None:
    assert devices_of({"metadata": {"uid": "u"}, "spec": {}}, DRIVER, POOL) == []
    assert devices_of(claim({"driver": DRIVER, "pool": POOL}), DRIVER, POOL) == []  # no device name
    assert devices_of({"status": {"allocation": {"devices": {"results": "x"}}}}, DRIVER, POOL) == []
