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
the claim for counters or shared capacity, the allocator's backtracking search is run (the same
first choice when there is one; it gives up after looking at :data:`SEARCH_LIMIT` devices, and
first fit's refusal is raised).

Consumable capacity (DRAConsumableCapacity, on in 1.37): a device with
``allowMultipleAllocations: true`` is never taken whole. Each request that picks it gets a share
of it: a result with a fresh ``shareID`` (a random UUID) and, when the device has capacities,
``consumedCapacity`` with an entry for each of them (written in the API server's canonical
quantity form). What a request consumes of a capacity is, when the request's
``capacity.requests`` names no amount for it, the ``requestPolicy.default``, or else the whole
capacity; an amount asked is taken as it is without a policy, raised to the first of the
``validValues`` not below it (or kept, above them all), or raised to ``validRange.min`` and then
to the next whole ``step`` from it. A device does not fit a request that asks for a capacity it
does not have, whose rounded amount the policy refuses (above ``max``, between steps, or not
one of ``validValues``), or whose amount, with what the shares of other claims' results (their
``consumedCapacity``) and this claim's earlier picks consume, passes the capacity's value. The
same sums hold for a device without ``allowMultipleAllocations``: a request's amounts filter it
(a device smaller than asked never fits), and a device whose capacities are partly held by
shares (its slice changed) is not taken whole. A shared device is picked at most once per
request but by as many requests and claims as its capacity allows; its counters are consumed
once, however many shares it has. A device allocated whole (a result without ``shareID``) is
never shared. A negative amount, or one the integer arithmetic cannot hold (past the int64
maximum), ends the allocation at once, as the allocator's errors do. Rounding to a step uses
``Value()`` integers (rounded up) as a default 1.37 scheduler does: DRAFractionalCapacityRange
needs ``--min-compatibility-version`` 1.37; :data:`FRACTIONAL_CAPACITY_RANGE` set to True uses
milli-units as a scheduler with that gate does.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from devplug._quantity import quantity
from devplug.testing._kubeapi.names import INT64_MAX, Quantity

if TYPE_CHECKING:
    from devplug.testing._kubeapi.store import Store

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

# How many devices the backtracking search may look at before it gives up (the scheduler's
# filter has a time limit instead).
SEARCH_LIMIT = 100_000

# The DRAFractionalCapacityRange gate of the scheduler (off unless its minimum compatibility
# version is 1.37).
FRACTIONAL_CAPACITY_RANGE = False


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


_DeviceID = tuple[str, str, str]  # (driver, pool, device)


class _Fatal(AllocationError):
    """An error of the allocator itself: it ends the allocation, no other choice is tried."""


def _allocated(
    store: Store, skip_uid: str
) -> tuple[dict[_DeviceID, str], dict[_DeviceID, dict[str, Decimal]]]:
    """What claims other than ``skip_uid`` hold (adminAccess results hold nothing): the devices
    allocated whole, with the claim's name, and the shared ones, with the sum of their shares'
    ``consumedCapacity``."""
    whole: dict[_DeviceID, str] = {}
    shared: dict[_DeviceID, dict[str, Decimal]] = {}
    for claim in store.items(store.kinds["resourceclaims"]):
        if claim["metadata"]["uid"] == skip_uid:
            continue
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []
        for r in results:
            if r.get("adminAccess"):
                continue
            device = (r["driver"], r["pool"], r["device"])
            if r.get("shareID") is None:
                whole[device] = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                continue
            consumed = shared.setdefault(device, {})
            for name, value in (r.get("consumedCapacity") or {}).items():
                consumed[name] = consumed.get(name, Decimal(0)) + quantity(value)
    return whole, shared


@dataclass(frozen=True)
class _Request:
    """One request of the claim: ``need`` is a count, "All" or a list of device names;
    ``capacity`` its ``capacity.requests`` (None without)."""

    name: str
    need: Any
    admin: bool
    capacity: dict[str, Quantity] | None = None


@dataclass
class _Pick:
    """A device chosen for a request: ``consumed`` is a share's consumption (None: the device is
    the claim's alone); ``counters`` whether this pick reserved the device's counters; ``opened``
    whether it is the claim's first share of the device."""

    pool: str
    device: dict[str, Any]
    consumed: dict[str, Quantity] | None = None
    counters: bool = False
    opened: bool = False


def _requests(claim: dict[str, Any], count: int | None, wishes: dict[str, list[str]]) -> list[_Request]:
    """The claim's requests, with the count or names asked for."""
    out: list[_Request] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly") or {}
        need: Any = exactly.get("count", 1)
        if exactly.get("allocationMode") == "All":
            need = "All"
        if request["name"] in wishes:
            need = wishes[request["name"]]
        if count is not None:
            need = count
        asked = (exactly.get("capacity") or {}).get("requests")
        capacity = None if asked is None else {k: Quantity.parse(v) for k, v in asked.items()}
        out.append(_Request(request["name"], need, bool(exactly.get("adminAccess")), capacity))
    return out


# -- consumable capacity ---------------------------------------------------------------------------

_UNREPRESENTABLE = "capacity request cannot be represented in the device's range arithmetic"


def _shared(device: dict[str, Any]) -> bool:
    return device.get("allowMultipleAllocations") is True


def _capacities(device: dict[str, Any]) -> dict[str, tuple[Quantity, dict[str, Any] | None]]:
    """The device's capacities: value and requestPolicy."""
    return {
        name: (Quantity.parse(c.get("value") or "0"), c.get("requestPolicy"))
        for name, c in sorted((device.get("capacity") or {}).items())
        if isinstance(c, dict)
    }


def _bound(bounds: dict[str, Any], key: str) -> Quantity | None:
    return None if bounds.get(key) is None else Quantity.parse(bounds[key])


def _milli(bounds: dict[str, Any], fractional: bool) -> bool:
    """useMilli: the gate is on, min, max and step hold in milli-units, and step is 1m or more."""
    if not fractional:
        return False
    given = [q for q in (_bound(bounds, k) for k in ("min", "max", "step")) if q is not None]
    step = _bound(bounds, "step")
    return all(q.milli_exact() for q in given) and (step is None or step.milli_value() >= 1)


def _round_up(asked: Quantity, bounds: dict[str, Any], fractional: bool) -> Quantity:
    """roundUpRange: at least min, then up to the next whole step from min (``step``'s format).

    Raises:
        ValueError: the arithmetic cannot hold the request or its rounding.
    """
    low = Quantity.parse(bounds["min"])
    step = _bound(bounds, "step")
    if asked.value < low.value:
        return low
    if step is None:
        return asked
    if _milli(bounds, fractional):
        if not asked.milli_exact():
            raise ValueError(f"{_UNREPRESENTABLE}: request {asked} is not a representable milli value")
        amount, size, base, unit, limit = (
            asked.milli_value(),
            step.milli_value(),
            low.milli_value(),
            Decimal("0.001"),
            "the milli-value range",
        )
    else:
        if asked.value > INT64_MAX:
            raise ValueError(f"{_UNREPRESENTABLE}: request {asked} exceeds MaxInt64")
        amount, size, base, unit, limit = (
            asked.int_value(),
            step.int_value(),
            low.int_value(),
            Decimal(1),
            "MaxInt64",
        )
    if size <= 0:  # refused by validation; the Go code would divide by zero
        raise ValueError(f"{_UNREPRESENTABLE}: step {step} is not positive")
    steps = -(-(amount - base) // size)
    if base >= 0 and steps > (INT64_MAX - base) // size:
        raise ValueError(f"{_UNREPRESENTABLE}: rounding request {asked} up to the next step passes {limit}")
    return Quantity((base + size * steps) * unit, step.format)


def _consumed(
    asked: Quantity | None, value: Quantity, policy: dict[str, Any] | None, fractional: bool
) -> Quantity:
    """calculateConsumedCapacity: what one share takes of a capacity.

    Raises:
        ValueError: the arithmetic cannot hold the request or its rounding.
    """
    if asked is None:
        default = (policy or {}).get("default")
        return value if default is None else Quantity.parse(default)
    if policy is None:
        return asked
    bounds = policy.get("validRange")
    if isinstance(bounds, dict) and bounds.get("min") is not None:
        return _round_up(asked, bounds, fractional)
    if policy.get("validValues") is not None:
        for raw in policy["validValues"]:
            option = Quantity.parse(raw)
            if asked.value <= option.value:
                return option
    return asked


def _violates(amount: Quantity, policy: dict[str, Any] | None, fractional: bool) -> bool:
    """violatesPolicy: the default is always allowed; else above max, off a step, or not one of
    the validValues."""
    if policy is None:
        return False
    if policy.get("default") is not None and Quantity.parse(policy["default"]).value == amount.value:
        return False
    bounds = policy.get("validRange")
    if isinstance(bounds, dict):
        return _off_range(amount, bounds, fractional)
    values = policy.get("validValues") or []
    return bool(values) and all(Quantity.parse(v).value != amount.value for v in values)


def _off_range(amount: Quantity, bounds: dict[str, Any], fractional: bool) -> bool:
    """violateValidRange: above max, or not a whole number of steps from min."""
    high, low, step = _bound(bounds, "max"), _bound(bounds, "min"), _bound(bounds, "step")
    if high is not None and amount.value > high.value:
        return True
    if step is None or low is None:
        return False
    if _milli(bounds, fractional):
        if not amount.milli_exact():
            return True
        offset, size = amount.milli_value() - low.milli_value(), step.milli_value()
    else:
        offset, size = amount.int_value() - low.int_value(), step.int_value()
    return size <= 0 or abs(offset) % size != 0


class _Allocator:
    """First-fit choice (and the search behind it) over the usable pools of one node and driver,
    for one claim."""

    def __init__(self, store: Store, claim: dict[str, Any], node: str, driver: str) -> None:
        meta = claim["metadata"]
        self.where = f"claim {meta['namespace']}/{meta['name']} on node {node} for driver {driver}"
        self.driver = driver
        self.fractional = FRACTIONAL_CAPACITY_RANGE
        pools, self.left, self.problems = _pools(store, node, driver)
        if not pools:
            why = "; ".join(self.problems) or f"no ResourceSlice of driver {driver} for node {node}"
            raise AllocationError(f"cannot allocate {self.where}: {why}")
        self.taken, self.shares = _allocated(store, meta["uid"])
        self.candidates = [
            (p, d) for p, slices in pools.items() for s in slices for d in s["spec"].get("devices") or []
        ]
        # This claim's picks: the devices it takes whole, and what its shares of the others consume.
        self.used: set[tuple[str, str]] = set()
        self.sharing: dict[tuple[str, str], dict[str, Decimal]] = {}
        # What is left of each counter once the other claims' devices took theirs (it may go
        # below zero if the slices changed under an allocation: then nothing more fits). A device
        # held by other claims, whole or in shares, consumes its counters once.
        self.consumes: dict[tuple[str, str], dict[_Key, Decimal]] = {}
        for pool, device in self.candidates:
            consumes = self.consumes.setdefault((pool, device["name"]), {})
            for key, value in _consumption(pool, device):
                consumes[key] = consumes.get(key, Decimal(0)) + value
            held = (driver, pool, device["name"])
            if held in self.taken or held in self.shares:
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

    def shared_already(self, pool: str, device: dict[str, Any]) -> bool:
        """Whether a share of the device is held (by another claim or this one): its counters
        are counted already."""
        return (self.driver, pool, device["name"]) in self.shares or (pool, device["name"]) in self.sharing

    def exhausted(self, pool: str, device: dict[str, Any]) -> str | None:
        """The counter that taking this device too would overdraw, as ``counter set S: C``."""
        wanted = self.consumes[(pool, device["name"])]
        if not wanted or (_shared(device) and self.shared_already(pool, device)):
            return None
        # The device's own counters first (the message names one of them), then the pool's others
        # (the picks so far stay within every counter that was not overdrawn already).
        for key, value in wanted.items():
            if self.using[key] + value > self.left[key]:
                return f"counter set {key[1]}: {key[2]} exhausted"
        over = self.overdrawn.get(pool)
        return None if over is None else f"counter set {over[1]}: {over[2]} exhausted"

    def consumed(self, request: _Request, pool: str, device: dict[str, Any]) -> dict[str, Quantity]:
        """What one share of the device for ``request`` consumes of each of its capacities.

        Raises:
            _Fatal: an amount is negative or the arithmetic cannot hold it.
        """
        asked = request.capacity or {}
        out: dict[str, Quantity] = {}
        for name, (value, policy) in _capacities(device).items():
            try:
                amount = _consumed(asked.get(name), value, policy, self.fractional)
                if amount.value < 0:
                    raise ValueError("capacity value is negative")
            except ValueError as exc:
                raise _Fatal(
                    f"cannot allocate {self.where}: request {request.name}: checking capacity for device "
                    f'{self.driver}/{pool}/{device["name"]}: capacity "{name}": {exc}'
                ) from None
            out[name] = amount
        return out

    def capacity_refusal(
        self, request: _Request, pool: str, device: dict[str, Any], *, alone: bool = False
    ) -> str | None:
        """Why the device's capacities do not fit ``request`` (CmpRequestOverCapacity); ``alone``:
        as if nothing were consumed of them (the check that decides what "All" devices are)."""
        capacities = _capacities(device)
        name = device["name"]
        missing = sorted(set(request.capacity or {}) - set(capacities))
        if missing:
            return f"device {name} has no capacity {missing[0]}"
        amounts = self.consumed(request, pool, device)
        held = self.shares.get((self.driver, pool, name), {})
        mine = self.sharing.get((pool, name), {})
        for capacity, (value, policy) in capacities.items():
            amount = amounts[capacity]
            if _violates(amount, policy, self.fractional):
                return f"device {name}: capacity {capacity}: {amount} is not allowed by its requestPolicy"
            used = Decimal(0) if alone else held.get(capacity, Decimal(0)) + mine.get(capacity, Decimal(0))
            if used + amount.value > value.value:
                if not used:
                    return f"device {name}: capacity {capacity} is {value}, less than the {amount} asked"
                left = Quantity(value.value - used, value.format)
                return f"device {name}: capacity {capacity} exhausted: {amount} asked, {left} of {value} left"
        return None

    def blocked(self, request: _Request, pool: str, device: dict[str, Any]) -> str | None:
        """What no choice of this claim changes: held whole by another claim, or tainted."""
        owner = self.taken.get((self.driver, pool, device["name"]))
        if owner is not None and not request.admin:
            return f"device {device['name']} is allocated to claim {owner}"
        for t in device.get("taints") or []:
            if t.get("effect") in _BLOCKING_EFFECTS:
                return (
                    f"device {device['name']} has the taint {t.get('key')}={t.get('value', '')}:{t['effect']}"
                )
        return None

    def refusal(self, request: _Request, pool: str, device: dict[str, Any]) -> str | None:
        """Why the scheduler would not pick this device, if it would not (in the allocator's order:
        held by another claim, capacity, counters, taints)."""
        owner = self.taken.get((self.driver, pool, device["name"]))
        if owner is not None and not request.admin:
            return f"device {device['name']} is allocated to claim {owner}"
        why = self.capacity_refusal(request, pool, device)
        if why is not None:
            return why
        counter = self.exhausted(pool, device)
        if counter is not None:
            return f"device {device['name']}: {counter}"
        return self.blocked(request, pool, device)

    def pick(self, request: _Request, pool: str, device: dict[str, Any]) -> _Pick | str:
        """Take the device for ``request`` (counters, capacity), or say why not."""
        why = self.refusal(request, pool, device)
        if why is not None:
            return why
        key = (pool, device["name"])
        counters = not (_shared(device) and self.shared_already(pool, device))
        if counters:
            self.take(pool, device)
        if not _shared(device):
            self.used.add(key)
            return _Pick(pool, device, counters=counters)
        consumed = self.consumed(request, pool, device)
        opened = key not in self.sharing
        sums = self.sharing.setdefault(key, {})
        for name, amount in consumed.items():
            sums[name] = sums.get(name, Decimal(0)) + amount.value
        return _Pick(pool, device, consumed, counters, opened)

    def undo(self, pick: _Pick) -> None:
        """Give back what :meth:`pick` took."""
        key = (pick.pool, pick.device["name"])
        if pick.counters:
            self.take(pick.pool, pick.device, -1)
        if pick.consumed is None:
            self.used.discard(key)
            return
        sums = self.sharing[key]
        for name, amount in pick.consumed.items():
            sums[name] -= amount.value
        if pick.opened:
            del self.sharing[key]

    def skipped(self, request: _Request, pool: str, device: dict[str, Any]) -> bool:
        """Devices a request does not look at: taken whole for this claim already, or not named."""
        if not _shared(device) and (pool, device["name"]) in self.used:
            return True
        return isinstance(request.need, list) and device["name"] not in request.need

    def choose(self, request: _Request) -> list[dict[str, Any]]:
        """Results for one request, first fit."""
        need = request.need
        chosen: list[_Pick] = []
        refusals: dict[str, str] = {}
        for pool, device in self.candidates:
            if self.skipped(request, pool, device):
                continue
            # "All" is every device whose capacities could hold the request at all.
            if need == "All" and self.capacity_refusal(request, pool, device, alone=True) is not None:
                continue
            got = self.pick(request, pool, device)
            if isinstance(got, str):
                refusals[device["name"]] = got
                continue
            chosen.append(got)
            if isinstance(need, int) and len(chosen) == need:
                break
        if isinstance(need, list):
            names = {p.device["name"] for p in chosen}
            for name in need:
                if name not in refusals and name not in names:
                    refusals[name] = f"device {name} is not in a usable pool"
        # "All" needs every such device of the node's pools: none taken or tainted, no pool incomplete.
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
                f"cannot allocate {self.where}: request {request.name} needs {wanted}, "
                f"{len(chosen)} usable: {why}"
            )
        return self.results(request, chosen)

    def results(self, request: _Request, chosen: list[_Pick]) -> list[dict[str, Any]]:
        """``status.allocation.devices.results`` entries for a request's devices (a share gets a
        new ``shareID`` and, if its device has capacities, ``consumedCapacity``)."""
        results: list[dict[str, Any]] = []
        for pick in chosen:
            result: dict[str, Any] = {
                "request": request.name,
                "driver": self.driver,
                "pool": pick.pool,
                "device": pick.device["name"],
            }
            if request.admin:
                result["adminAccess"] = True
            for key in ("bindingConditions", "bindingFailureConditions"):
                if pick.device.get(key):  # the scheduler's binding waits for them (KEP-5007)
                    result[key] = list(pick.device[key])
            if pick.consumed is not None:
                result["shareID"] = str(uuid.uuid4())
                if pick.consumed:
                    result["consumedCapacity"] = {name: str(q) for name, q in sorted(pick.consumed.items())}
            results.append(result)
        return results

    def search(self, plan: list[_Request]) -> list[dict[str, Any]] | None:
        """The results the allocator's backtracking search finds first, or None (none, or it gave up).

        Devices are tried in first-fit order and each request's in that order (a set of devices
        fits the counters and capacities or not whatever the order), so the first complete
        choice is the scheduler's, and first fit's whenever first fit completes.
        """
        steps: list[tuple[_Request, list[tuple[str, dict[str, Any]]], int]] = []
        for request in plan:
            if request.need == "All":
                every = [
                    (pool, d)
                    for pool, d in self.candidates
                    if self.capacity_refusal(request, pool, d, alone=True) is None
                ]
                if self.problems or not every or any(self.blocked(request, p, d) for p, d in every):
                    return None
                steps.append((request, every, len(every)))
                continue
            eligible = [
                (pool, d)
                for pool, d in self.candidates
                if not (isinstance(request.need, list) and d["name"] not in request.need)
                and self.blocked(request, pool, d) is None
            ]
            count = len(request.need) if isinstance(request.need, list) else request.need
            steps.append((request, eligible, count))
        picks: list[list[_Pick]] = [[] for _ in steps]
        if not self._fill(steps, picks, 0, 0):
            return None
        return [
            r
            for (request, _, _), chosen in zip(steps, picks, strict=True)
            for r in self.results(request, chosen)
        ]

    def _fill(
        self,
        steps: list[tuple[_Request, list[tuple[str, dict[str, Any]]], int]],
        picks: list[list[_Pick]],
        step: int,
        start: int,
    ) -> bool:
        """Complete ``picks`` from step ``step``, its next device at ``start`` or later."""
        if step == len(steps):
            return True
        request, eligible, count = steps[step]
        if len(picks[step]) == count:
            return self._fill(steps, picks, step + 1, 0)
        for i in range(start, len(eligible) - (count - len(picks[step])) + 1):
            self.tries -= 1
            if self.tries < 0:
                return False
            pool, device = eligible[i]
            if self.skipped(request, pool, device):
                continue
            got = self.pick(request, pool, device)
            if isinstance(got, str):
                continue
            picks[step].append(got)
            if self._fill(steps, picks, step, i + 1):
                return True
            picks[step].pop()
            self.undo(got)
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
    plan: list[_Request] = []
    for request in requests:
        wanted = request.need
        if pending is not None and wanted != "All":  # the named devices, split over the requests
            n = wanted if isinstance(wanted, int) else len(wanted)
            wanted, pending = pending[:n], pending[n:]
        plan.append(_Request(request.name, wanted, request.admin, request.capacity))
    try:
        results = [r for request in plan for r in allocator.choose(request)]
    except _Fatal:
        raise
    except AllocationError:
        # First fit may have given a device whose counters or capacity a later pick needed: the
        # scheduler backtracks. Without either, first fit fails only where every choice would.
        retry = allocator.left or any(_shared(d) for _, d in allocator.candidates)
        found = _Allocator(store, claim, node, driver).search(plan) if retry else None
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
