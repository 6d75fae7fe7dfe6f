"""Consumable shares (NVIDIA's ``ConsumableShares`` gate with ``--consumable-shares``): GPUs and
MIG devices that several claims are allocated at once, each a share of the device.

Published as NVIDIA's DRA driver v0.5.0 publishes them (``applyConsumableShares``): the device
has ``allowMultipleAllocations``; its ``memory`` capacity is rounded down to a whole MiB and gets
a request policy in steps of ``1Mi`` up to that value, with a default of all of it (``memory``:
a claim that names no amount takes the whole device) or of nothing (``unlimited``, and an
integer N); an integer N also adds the capacity ``shares: N`` (a claim takes one by default).
The other capacities keep no policy, so a claim that names no amount of them takes them whole,
as with NVIDIA's driver. A device without a ``memory`` capacity is only marked shared.

A share is prepared as NVIDIA prepares it: the container gets the whole device (the same CDI
edits as an unshared device, in the claim's own spec; no per-share limit is set); the sharing
config (time-slicing) of every claim using a device must be the same, and MPS is refused.
Which config each claim's devices were prepared with is kept in ``<plugin dir>/shares/<claim
UID>.json`` to compare a later claim's against.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from devplug._quantity import quantity
from devplug.dra import CapacityRequestPolicy
from devplug.errors import DevplugError
from devplug_nvidia._dra._devices import binary_quantity

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from devplug.models import Device
    from devplug_nvidia.config import ConsumableShares

__all__ = ["MIB", "ShareConfigs", "ShareConflictError", "shared_device"]

MIB = 1024 * 1024
"""The step of a shared device's memory policy (``1Mi``)."""
MEMORY = "memory"
SHARES = "shares"


def shared_device(device: Device, mode: ConsumableShares) -> Device:
    """``device`` as NVIDIA publishes it with ``--consumable-shares=<mode>``."""
    capacity = dict(device.capacity)
    policies: dict[str, CapacityRequestPolicy] = {}
    update: dict[str, Any] = {"allow_multiple_allocations": True}
    if MEMORY in capacity:
        whole = (int(quantity(capacity[MEMORY])) // MIB) * MIB
        memory = binary_quantity(whole)
        capacity[MEMORY] = memory
        if mode == "memory":
            policies[MEMORY] = CapacityRequestPolicy(default=memory, min="1Mi", max=memory, step="1Mi")
        else:
            policies[MEMORY] = CapacityRequestPolicy(default="0", min="0", max=memory, step="1Mi")
        if isinstance(mode, int):
            capacity[SHARES] = str(mode)
            policies[SHARES] = CapacityRequestPolicy(default="1", min="1", max=str(mode), step="1")
        update.update(capacity=capacity, request_policies=policies)
    # Made anew, not copied: the policies are checked as the API server checks them.
    fields = {name: getattr(device, name) for name in type(device).model_fields}
    return type(device)(**{**fields, **update})


class ShareConflictError(DevplugError):
    """A claim asks for a shared device with another config than the claims already using it."""


class ShareConfigs:
    """Which config each prepared claim's devices got, to refuse a claim whose config for a
    device differs from another claim's (NVIDIA's ``validateNoOverlappingPreparedDevices`` with
    consumable shares): one JSON file per claim, ``{device name: config}``.

    Args:
        directory: ``<plugin dir>/shares``.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def check(self, claim_uid: str, configs: Mapping[str, Any], used: set[str]) -> None:
        """Refuse ``configs`` (device name → the config in JSON form) of claim ``claim_uid`` where
        another claim prepared one of the ``used`` devices (those with other shares) with
        another config.

        Raises:
            ShareConflictError: NVIDIA's words, naming the device and the other claim.
        """
        if not used:
            return
        for path in sorted(self.directory.glob("*.json")):
            other = path.stem
            if other == claim_uid:
                continue
            recorded = self._read(path)
            for name in sorted(used & recorded.keys()):
                if name in configs and recorded[name] != configs[name]:
                    raise ShareConflictError(
                        f"unable to prepare claim {claim_uid}: requested device {name} has conflicting "
                        f"configuration with already prepared claim {other}"
                    )

    def record(self, claim_uid: str, configs: Mapping[str, Any]) -> None:
        """Keep the configs claim ``claim_uid`` was prepared with."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{claim_uid}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(dict(configs), sort_keys=True))
        temporary.replace(path)

    def forget(self, claim_uid: str) -> None:
        """Drop claim ``claim_uid``'s configs (unprepared)."""
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{claim_uid}.json").unlink()

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}  # gone meanwhile, or torn: nothing to compare with
        return data if isinstance(data, dict) else {}
