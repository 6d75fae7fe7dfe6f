"""Allocating a ResourceClaim on one node, by the rules of the scheduler's DRA allocator.

Only the node's own pools of the driver count (slices with ``spec.nodeName`` = the node), each
at its highest generation, and only if complete (``resourceSliceCount`` slices at that
generation); a pool with a device name twice is invalid. A device allocated to another claim
(without adminAccess) or carrying a NoSchedule or NoExecute taint is never chosen. Devices are
chosen first fit, in slice-name then device order (the order the Go helper's indexed slice names
make the allocation priority). CEL selectors and device classes are not evaluated.

Shared counters (DRAPartitionableDevices, Kubernetes 1.35's shape): the counter sets of a pool
are the ``sharedCounters`` of all its current slices; a set name twice, or a device consuming
from a set or a counter the pool does not have, makes the pool invalid (as the scheduler's pool
gathering does). What is left of a counter is its value less what the pool's devices allocated
to other claims consume (adminAccess results consume nothing); a device that consumes counters
is chosen only if what the devices chosen so far for this claim consume, with it, stays within
what is left of every counter of its pool (adminAccess picks of this claim are counted too, as
the allocator counts them). Quantities are compared exactly. Where first fit cannot complete
the claim for counters, the allocator's backtracking search is run (the same first choice when
there is one; it gives up after looking at :data:`SEARCH_LIMIT` devices, and first fit's refusal
is raised).
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from devplug._quantity import quantity

if TYPE_CHECKING:
    from devplug.testing._kubeapi.store import Store

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

# How many devices the backtracking search may look at before it gives up (the scheduler's
# filter has a time limit instead).
SEARCH_LIMIT = 100_000


class AllocationError(Exception):
    """``FakeKubeAPI.allocate_claim`` cannot allocate the claim as the scheduler would."""


_Key = tuple[str, str, str]  # (pool, counter set, counter)


def _counter_sets(pool: str, slices: list[dict[str, Any]]) -> dict[_Key, Decimal]:
    """The pool's counters and their values.

    Raises:
        ValueError: what makes the pool invalid (the allocator's words).
    """
    values: dict[_Key, Decimal] = {}
    sets: set[str] = set()
    for s in slices:
        for counter_set in s["spec"].get("sharedCounters") or []:
            name = counter_set["name"]
            if name in sets:
                raise ValueError(f"duplicate counter set name {name}")
            sets.add(name)
            for counter, c in (counter_set.get("counters") or {}).items():
                values[(pool, name, counter)] = quantity(c.get("value"))
    for s in slices:
        for d in s["spec"].get("devices") or []:
            for consumption in d.get("consumesCounters") or []:
                name = consumption["counterSet"]
                if name not in sets:
                    raise ValueError(f"counter set {name} not found")
                for counter, c in (consumption.get("counters") or {}).items():
                    if (pool, name, counter) not in values:
                        raise ValueError(f"counter {counter} not found in counter set {name}")
                    quantity(c.get("value"))
    return values


def _consumption(pool: str, device: dict[str, Any]) -> list[tuple[_Key, Decimal]]:
    """What the device takes from its pool's counters while allocated."""
    return [
        ((pool, consumption["counterSet"], counter), quantity(c.get("value")))
        for consumption in device.get("consumesCounters") or []
        for counter, c in (consumption.get("counters") or {}).items()
    ]


def _pools(
    store: Store, node: str, driver: str
) -> tuple[dict[str, list[dict[str, Any]]], dict[_Key, Decimal], list[str]]:
    """The usable pools (name → current slices), their counters and why the others are not usable."""
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for s in store.items(store.kinds["resourceslices"]):
        spec = s["spec"]
        if spec.get("driver") == driver and spec.get("nodeName") == node:
            by_pool.setdefault(spec["pool"]["name"], []).append(s)
    usable: dict[str, list[dict[str, Any]]] = {}
    counters: dict[_Key, Decimal] = {}
    problems: list[str] = []
    for name, slices in sorted(by_pool.items()):
        generation = max(s["spec"]["pool"].get("generation", 0) for s in slices)
        current = sorted(
            (s for s in slices if s["spec"]["pool"].get("generation", 0) == generation),
            key=lambda s: s["metadata"]["name"],
        )
        expected = current[0]["spec"]["pool"]["resourceSliceCount"]
        if len(current) != expected:
            seen = f"{len(current)} of {expected} ResourceSlices at generation {generation}"
            problems.append(f"pool {name} is incomplete: {seen}")
            continue
        names = [d["name"] for s in current for d in s["spec"].get("devices") or []]
        if len(names) != len(set(names)):
            problems.append(f"pool {name} is invalid: a device name appears twice at generation {generation}")
            continue
        try:
            counters.update(_counter_sets(name, current))
        except ValueError as exc:
            problems.append(f"pool {name} is invalid: {exc}")
            continue
        usable[name] = current
    return usable, counters, problems


def _taken(store: Store, skip_uid: str) -> dict[tuple[str, str, str], str]:
    """Devices allocated (without adminAccess) to claims other than ``skip_uid``, with the claim's name."""
    taken: dict[tuple[str, str, str], str] = {}
    for claim in store.items(store.kinds["resourceclaims"]):
        if claim["metadata"]["uid"] == skip_uid:
            continue
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []
        for r in results:
            if not r.get("adminAccess"):
                taken[(r["driver"], r["pool"], r["device"])] = (
                    f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                )
    return taken


def _requests(
    claim: dict[str, Any], count: int | None, wishes: dict[str, list[str]]
) -> list[tuple[str, Any, bool]]:
    """(request name, a count, "All" or a list of device names, adminAccess) for each request."""
    out: list[tuple[str, Any, bool]] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly") or {}
        need: Any = exactly.get("count", 1)
        if exactly.get("allocationMode") == "All":
            need = "All"
        if request["name"] in wishes:
            need = wishes[request["name"]]
        if count is not None:
            need = count
        out.append((request["name"], need, bool(exactly.get("adminAccess"))))
    return out


class _Allocator:
    """First-fit choice (and the search behind it) over the usable pools of one node and driver,
    for one claim."""

    def __init__(self, store: Store, claim: dict[str, Any], node: str, driver: str) -> None:
        meta = claim["metadata"]
        self.where = f"claim {meta['namespace']}/{meta['name']} on node {node} for driver {driver}"
        self.driver = driver
        pools, self.left, self.problems = _pools(store, node, driver)
        if not pools:
            why = "; ".join(self.problems) or f"no ResourceSlice of driver {driver} for node {node}"
            raise AllocationError(f"cannot allocate {self.where}: {why}")
        self.taken = _taken(store, meta["uid"])
        self.candidates = [
            (p, d) for p, slices in pools.items() for s in slices for d in s["spec"].get("devices") or []
        ]
        self.used: set[tuple[str, str]] = set()
        # What is left of each counter once the other claims' devices took theirs (it may go
        # below zero if the slices changed under an allocation: then nothing more fits).
        self.consumes: dict[tuple[str, str], dict[_Key, Decimal]] = {}
        for pool, device in self.candidates:
            consumes = self.consumes.setdefault((pool, device["name"]), {})
            for key, value in _consumption(pool, device):
                consumes[key] = consumes.get(key, Decimal(0)) + value
            if (driver, pool, device["name"]) in self.taken:
                for key, value in consumes.items():
                    self.left[key] -= value
        # The allocator checks every counter of the pool: one overdrawn already refuses them all.
        self.overdrawn = {key[0]: key for key, value in reversed(self.left.items()) if value < 0}
        self.using: dict[_Key, Decimal] = dict.fromkeys(self.left, Decimal(0))
        self.tries = SEARCH_LIMIT

    def take(self, pool: str, device: dict[str, Any], sign: int = 1) -> None:
        """Count the device's consumption as this claim's (``sign`` -1: no longer)."""
        for key, value in self.consumes[(pool, device["name"])].items():
            self.using[key] += sign * value

    def exhausted(self, pool: str, device: dict[str, Any]) -> str | None:
        """The counter that taking this device too would overdraw, as ``counter set S: C``."""
        wanted = self.consumes[(pool, device["name"])]
        if not wanted:
            return None
        # The device's own counters first (the message names one of them), then the pool's others
        # (the picks so far stay within every counter that was not overdrawn already).
        for key, value in wanted.items():
            if self.using[key] + value > self.left[key]:
                return f"counter set {key[1]}: {key[2]} exhausted"
        over = self.overdrawn.get(pool)
        return None if over is None else f"counter set {over[1]}: {over[2]} exhausted"

    def refusal(self, pool: str, device: dict[str, Any], admin: bool) -> str | None:
        """Why the scheduler would not pick this device, if it would not."""
        owner = self.taken.get((self.driver, pool, device["name"]))
        if owner is not None and not admin:
            return f"device {device['name']} is allocated to claim {owner}"
        counter = self.exhausted(pool, device)
        if counter is not None:
            return f"device {device['name']}: {counter}"
        for t in device.get("taints") or []:
            if t.get("effect") in _BLOCKING_EFFECTS:
                return (
                    f"device {device['name']} has the taint {t.get('key')}={t.get('value', '')}:{t['effect']}"
                )
        return None

    def choose(self, request: str, need: Any, admin: bool) -> list[dict[str, Any]]:
        """Results for one request: ``need`` is a count, "All" or a list of device names."""
        chosen: list[tuple[str, str]] = []
        refusals: dict[str, str] = {}
        for pool, device in self.candidates:
            if (pool, device["name"]) in self.used or (isinstance(need, list) and device["name"] not in need):
                continue
            why = self.refusal(pool, device, admin)
            if why is not None:
                refusals[device["name"]] = why
            elif not isinstance(need, int) or len(chosen) < need:
                chosen.append((pool, device["name"]))
                self.take(pool, device)
        if isinstance(need, list):
            for name in need:
                if name not in refusals and name not in {d for _, d in chosen}:
                    refusals[name] = f"device {name} is not in a usable pool"
        # "All" needs every device of the node's pools: none taken or tainted, no pool incomplete.
        if need == "All":
            failed = bool(refusals or self.problems or not chosen)
        else:
            failed = len(chosen) < (len(need) if isinstance(need, list) else need)
        if failed:
            wanted = (
                "all devices"
                if need == "All"
                else f"{len(need) if isinstance(need, list) else need} device(s)"
            )
            why = "; ".join([*self.problems, *refusals.values()]) or "no more devices"
            raise AllocationError(
                f"cannot allocate {self.where}: request {request} needs {wanted}, {len(chosen)} usable: {why}"
            )
        self.used.update(chosen)
        return self.results(request, chosen, admin)

    def results(self, request: str, chosen: list[tuple[str, str]], admin: bool) -> list[dict[str, Any]]:
        """``status.allocation.devices.results`` entries for a request's devices."""
        results: list[dict[str, Any]] = []
        for pool, device_name in chosen:
            result: dict[str, Any] = {
                "request": request,
                "driver": self.driver,
                "pool": pool,
                "device": device_name,
            }
            if admin:
                result["adminAccess"] = True
            results.append(result)
        return results

    def search(self, plan: list[tuple[str, Any, bool]]) -> list[dict[str, Any]] | None:
        """The results the allocator's backtracking search finds first, or None (none, or it gave up).

        Devices are tried in first-fit order and each request's in that order (a set of devices
        fits the counters or not whatever the order), so the first complete choice is the
        scheduler's, and first fit's whenever first fit completes.
        """
        steps: list[tuple[str, bool, list[tuple[str, dict[str, Any]]], int]] = []
        for request, need, admin in plan:
            eligible = [
                (pool, d)
                for pool, d in self.candidates
                if not (isinstance(need, list) and d["name"] not in need)
                and (admin or (self.driver, pool, d["name"]) not in self.taken)
                and not any(t.get("effect") in _BLOCKING_EFFECTS for t in d.get("taints") or [])
            ]
            if need == "All" and (self.problems or len(eligible) < len(self.candidates)):
                return None
            count = len(self.candidates) if need == "All" else len(need) if isinstance(need, list) else need
            steps.append((request, admin, eligible, count))
        picks: list[list[tuple[str, str]]] = [[] for _ in steps]
        if not self._fill(steps, picks, 0, 0):
            return None
        return [
            r
            for (request, admin, _, _), chosen in zip(steps, picks, strict=True)
            for r in self.results(request, chosen, admin)
        ]

    def _fill(
        self,
        steps: list[tuple[str, bool, list[tuple[str, dict[str, Any]]], int]],
        picks: list[list[tuple[str, str]]],
        step: int,
        start: int,
    ) -> bool:
        """Complete ``picks`` from step ``step``, its next device at ``start`` or later."""
        if step == len(steps):
            return True
        _, _, eligible, count = steps[step]
        if len(picks[step]) == count:
            return self._fill(steps, picks, step + 1, 0)
        for i in range(start, len(eligible) - (count - len(picks[step])) + 1):
            self.tries -= 1
            if self.tries < 0:
                return False
            pool, device = eligible[i]
            key = (pool, device["name"])
            if key in self.used or self.exhausted(pool, device) is not None:
                continue
            self.used.add(key)
            self.take(pool, device)
            picks[step].append(key)
            if self._fill(steps, picks, step, i + 1):
                return True
            picks[step].pop()
            self.used.discard(key)
            self.take(pool, device, -1)
        return False


def allocate(
    store: Store,
    claim: dict[str, Any],
    *,
    node: str,
    driver: str,
    devices: list[str] | None,
    count: int | None,
    config: list[dict[str, Any]] | None,
    wishes: dict[str, list[str]],
) -> dict[str, Any]:
    """The claim's ``status.allocation``; raises AllocationError when the scheduler could not allocate."""
    allocator = _Allocator(store, claim, node, driver)
    if (claim.get("status") or {}).get("allocation"):
        raise AllocationError(f"cannot allocate {allocator.where}: it is already allocated")
    requests = _requests(claim, count, wishes)
    if not requests:
        raise AllocationError(f"cannot allocate {allocator.where}: the claim has no device requests")
    pending = list(devices) if devices is not None else None
    plan: list[tuple[str, Any, bool]] = []
    for name, need, admin in requests:
        wanted = need
        if pending is not None and need != "All":  # the named devices, split over the requests
            n = need if isinstance(need, int) else len(need)
            wanted, pending = pending[:n], pending[n:]
        plan.append((name, wanted, admin))
    try:
        results = [r for name, wanted, admin in plan for r in allocator.choose(name, wanted, admin)]
    except AllocationError:
        # First fit may have given a device whose counters a later pick needed: the scheduler
        # backtracks. Without counters first fit fails only where every choice would.
        found = _Allocator(store, claim, node, driver).search(plan) if allocator.left else None
        if found is None:
            raise
        results = found
    allocated: dict[str, Any] = {"results": results}
    configs = _config(claim, driver, config)
    if configs:
        allocated["config"] = configs
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"devices": allocated, "nodeSelector": {"nodeSelectorTerms": [selector]}}


def _config(claim: dict[str, Any], driver: str, config: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Class configuration first, then the claim's own, as the allocator orders them.

    An entry without ``opaque`` is taken as the opaque parameters for ``driver``; ``source``
    defaults to FromClaim.
    """
    entries: list[dict[str, Any]] = []
    for item in config or []:
        entry: dict[str, Any] = (
            copy.deepcopy(item)
            if "opaque" in item
            else {"opaque": {"driver": driver, "parameters": copy.deepcopy(item)}}
        )
        entry.setdefault("source", "FromClaim")
        entries.append(entry)
    from_spec = [
        {
            "source": "FromClaim",
            **({"requests": c["requests"]} if c.get("requests") else {}),
            "opaque": c["opaque"],
        }
        for c in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
        if c.get("opaque")
    ]
    by_class = [e for e in entries if e["source"] == "FromClass"]
    by_claim = [e for e in entries if e["source"] != "FromClass"]
    return by_class + from_spec + by_claim
