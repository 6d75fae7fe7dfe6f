"""Who holds which device, whichever Kubernetes API gave it: one record for a node served through
both, so that neither side gives a device the other has given.

::

    device-plugin side                          DRA side
    Allocate ─────────┐                ┌──────── claim allocated to this pool (API server watch)
    pod-resources ────┼─► Ledger ◄─────┼──────── claim prepared (checkpoint, NodePrepareResources)
                      │                │
    withheld from DRA ◄┘                └► withheld from the device-plugin stream
    (NoSchedule taint in the slices)       (reported Unhealthy: the kubelet neither counts nor
                                            assigns it)

A device-plugin hold is keyed by (resource name, device ID); a DRA hold by the device's name in
the driver's slices. Both are turned into a *footprint* to be compared: the device itself and the
counter sets it consumes (a partition and the whole device it is cut from overlap through their
counter set), with the footprints known from the devices published (:meth:`Ledger.set_devices`).

Nothing is released on a guess: a device-plugin hold ends only when a pod-resources read that
succeeded no longer lists it (an Allocate not listed yet is kept for :data:`ALLOCATE_GRACE`
seconds: the kubelet records it once the answer is back); a DRA hold ends only when the claim is
gone from the API server's answer and unprepared. Pure, no I/O: the readers feed it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from devplug._versioned import Versioned

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from devplug.models import Device

__all__ = ["ALLOCATE_GRACE", "Ledger", "PluginKey", "Withheld"]

PluginKey = tuple[str, str]
"""(resource name, device ID): a device as the device-plugin API names it."""

ALLOCATE_GRACE = 5.0
"""Seconds a device given by Allocate stays held while no pod-resources read lists it. The
kubelet records the assignment as soon as the answer is back (a read moments later lists it),
so this only covers a kubelet slow to do so; a pod that ended, or whose admission failed after
the Allocate, frees its device once a read started this long after the Allocate misses it."""

REPLICA_SEPARATOR = "::"
"""Replicated devices (NVIDIA's time-slicing: ``<uuid>::<n>``) name the device before it."""

_Element = tuple[str, ...]


@dataclass(frozen=True)
class Withheld:
    """Why a device is withheld from one API: who holds it through the other."""

    api: str
    """The API that gave it: ``device-plugin`` or ``dra``."""
    holder: str
    """The pod (``namespace/pod (container c)``), the claim (``namespace/name``), or for an
    Allocate whose pod the kubelet has not listed yet, ``an Allocate``."""

    def __str__(self) -> str:
        through = "the device plugin" if self.api == "device-plugin" else "DRA"
        return f"held through {through} by {self.holder}"


class Ledger:
    """The device holders of both APIs on one node; see the module's description.

    ``clock`` (monotonic seconds) is for tests. Every change bumps :attr:`changes` and calls the
    listeners (sync, on the event loop), so each side re-reads what it withholds.
    """

    def __init__(self, *, grace: float = ALLOCATE_GRACE, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self._clock = clock
        self._allocated: dict[PluginKey, float] = {}
        self._pods: dict[PluginKey, list[object]] = {}  # holders: pods, shown by str()
        self._claims_allocated: dict[str, tuple[str, frozenset[str]]] = {}
        self._claims_prepared: dict[str, tuple[str, frozenset[str]]] = {}
        self._by_key: dict[PluginKey, Device] = {}
        self._by_id: dict[str, PluginKey] = {}
        self._names: dict[str, PluginKey] = {}
        self._keys: dict[PluginKey, str] = {}
        self._cache: tuple[int, dict[_Element, Withheld], dict[_Element, Withheld]] | None = None
        self._listeners: list[Callable[[], None]] = []
        self.changes = Versioned(0)
        """Bumped by every change of a hold, of the devices' footprints, or of readiness."""
        self.plugin_changes = Versioned(0)
        """Bumped when what DRA must withhold may have changed: the device-plugin holds, the
        footprints, readiness (the slice publisher follows it)."""
        self.conflicts: Counter[str] = Counter()
        """Refusals by side: ``allocate`` (the device-plugin side refused a device DRA holds),
        ``prepare`` (the DRA side refused one the device-plugin side holds)."""
        self.pods_read = False
        """A pod-resources read has succeeded (the device-plugin holds are known)."""
        self.claims_read = False
        """The API server's claims have been listed (the DRA allocations are known)."""
        self._logged: set[tuple[str, str, str]] = set()
        self.reads_wanted = Versioned(0)
        """Bumped when a pod-resources read is wanted sooner than its period (after Allocate)."""

    # -- feeding ---------------------------------------------------------------------------------

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (sync, on the event loop) after every change of what the
        device-plugin side must withhold: the DRA holds, the footprints, readiness. An Allocate's
        own hold does not call it. Returns what stops it."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def set_devices(self, entries: Iterable[tuple[str, str, Device]]) -> None:
        """The devices published, as (DRA name, resource, device): their footprints."""
        by_key: dict[PluginKey, Device] = {}
        names: dict[str, PluginKey] = {}
        for name, resource, device in entries:
            by_key[(resource, device.id)] = device
            names[name] = (resource, device.id)
        if by_key == self._by_key and names == self._names:
            return
        self._by_key, self._names = by_key, names
        ids = Counter(device_id for _, device_id in by_key)
        self._by_id = {device_id: key for key in by_key if ids[(device_id := key[1])] == 1}
        self._keys = {key: name for name, key in names.items()}
        self._changed(plugin_side=True, dra_side=True)

    def allocated(self, resource: str, device_ids: Iterable[str]) -> None:
        """The device-plugin side gave ``device_ids`` (Allocate), their pod not known yet."""
        now = self._clock()
        for device_id in device_ids:
            self._allocated[(resource, device_id)] = now
        self._changed(plugin_side=True)
        self.reads_wanted.bump()

    def pods(self, held: Mapping[PluginKey, Sequence[object]], *, read_at: float) -> None:
        """A pod-resources read that succeeded, started at ``read_at`` (this clock): the devices
        running pods hold through the device-plugin API. Allocations it lists are confirmed,
        those older than the grace it does not list are released."""
        pods = {key: list(holders) for key, holders in held.items() if holders}
        allocated = {
            key: at for key, at in self._allocated.items() if key not in pods and read_at - at < self.grace
        }
        first = not self.pods_read
        self.pods_read = True
        if pods == self._pods and allocated == self._allocated and not first:
            return
        self._pods, self._allocated = pods, allocated
        self._changed(plugin_side=True, dra_side=first)

    def claims(self, allocated: Mapping[str, tuple[str, Iterable[str]]]) -> None:
        """Every claim allocated devices of this driver's pool, by UID: (``namespace/name``,
        device names), as the API server lists them now."""
        claims = {uid: (ref, frozenset(names)) for uid, (ref, names) in allocated.items()}
        first = not self.claims_read
        self.claims_read = True
        if claims == self._claims_allocated and not first:
            return
        self._claims_allocated = claims
        self._changed(plugin_side=first, dra_side=True)

    def claim(self, uid: str, ref: str, names: Iterable[str] | None) -> None:
        """One claim's allocation changed (a watch event): its device names, None when it is
        gone or no longer allocated devices of this pool."""
        if names is None:
            if self._claims_allocated.pop(uid, None) is not None:
                self._changed(dra_side=True)
            return
        value = (ref, frozenset(names))
        if self._claims_allocated.get(uid) != value:
            self._claims_allocated[uid] = value
            self._changed(dra_side=True)

    def prepared(self, uid: str, ref: str, names: Iterable[str]) -> None:
        """The DRA side prepared (or is preparing) claim ``uid`` with these devices."""
        value = (ref, frozenset(names))
        if self._claims_prepared.get(uid) != value:
            self._claims_prepared[uid] = value
            self._changed(dra_side=True)

    def unprepared(self, uid: str) -> None:
        """Claim ``uid`` was unprepared (or its prepare failed)."""
        if self._claims_prepared.pop(uid, None) is not None:
            self._changed(dra_side=True)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Both sides' holds have been read once (the ledger was rebuilt)."""
        return self.pods_read and self.claims_read

    def from_dra(self, name: str) -> Withheld | None:
        """Whether the device named ``name`` in the slices must be withheld from DRA, and why."""
        held_by_plugin, _ = self._held()
        return _first(self._footprint_of_name(name), held_by_plugin)

    def from_plugin(self, resource: str, device_id: str) -> Withheld | None:
        """Whether device ``device_id`` of ``resource`` must be withheld from the device-plugin
        side, and why."""
        _, held_by_dra = self._held()
        return _first(self._footprint((resource, device_id)), held_by_dra)

    def holder(self, resource: str, device_id: str) -> Withheld | None:
        """Who holds the published device, whichever API gave it (None: free)."""
        key = (resource, device_id)
        for held, pods in self._pods.items():
            if pods and self._resolve(held) == key:
                return Withheld("device-plugin", str(pods[0]))
        if any(self._resolve(held) == key for held in self._allocated):
            return Withheld("device-plugin", "an Allocate")
        name = self._keys.get(key)
        for ref, names in (*self._claims_prepared.values(), *self._claims_allocated.values()):
            if name is not None and name in names:
                return Withheld("dra", ref)
        return None

    def counts(self) -> dict[str, int]:
        """Devices held now, by API (a device held by several pods or claims counts once; a pod's
        device that is none of those published is not counted)."""
        plugin = {self._resolve(key) for key in (*self._pods, *self._allocated)} - {None}
        dra: set[str] = set()
        for _, names in (*self._claims_prepared.values(), *self._claims_allocated.values()):
            dra |= names
        return {"device-plugin": len(plugin), "dra": len(dra)}

    def refused(self, side: str, device: str, why: Withheld) -> bool:
        """Count a refusal (``allocate`` or ``prepare``); whether it is the first for this device
        and holder (to be logged once)."""
        self.conflicts[side] += 1
        key = (side, device, why.holder)
        if key in self._logged:
            return False
        if len(self._logged) > 10_000:
            self._logged.clear()
        self._logged.add(key)
        return True

    def state(self) -> dict[str, object]:
        """What ``/debug/state`` shows of the ledger."""
        return {
            "ready": self.ready,
            "pod_resources_read": self.pods_read,
            "claims_listed": self.claims_read,
            "held": self.counts(),
            "conflicts": dict(self.conflicts),
            "device_plugin": sorted(
                [f"{r}/{d}: {holders[0]}" for (r, d), holders in self._pods.items() if self._resolve((r, d))]
                + [f"{r}/{d}: an Allocate" for (r, d) in self._allocated]
            ),
            "dra": sorted(
                f"{name}: {ref}"
                for ref, names in {*self._claims_prepared.values(), *self._claims_allocated.values()}
                for name in names
            ),
        }

    # -- internals -------------------------------------------------------------------------------

    def _changed(self, *, plugin_side: bool = False, dra_side: bool = False) -> None:
        """A change of the device-plugin holds (``plugin_side``: what DRA withholds) or of the
        DRA holds (``dra_side``: what the device-plugin side withholds), or both."""
        self._cache = None
        self.changes.bump()
        if plugin_side:
            self.plugin_changes.bump()
        if dra_side:
            for callback in list(self._listeners):
                callback()

    def _resolve(self, key: PluginKey) -> PluginKey | None:
        """The published device a device-plugin key names: itself; the device a replica ID
        (``<id>::<n>``) names; or, under another resource name (a MIG strategy's
        ``nvidia.com/mig-1g.5gb``, another plugin's name for the same hardware), the one
        published device of that ID. None: not one of the devices published."""
        if key in self._by_key:
            return key
        device_id = key[1]
        base = device_id.split(REPLICA_SEPARATOR, 1)[0] if REPLICA_SEPARATOR in device_id else device_id
        if (key[0], base) in self._by_key:
            return (key[0], base)
        return self._by_id.get(base)

    def _footprint(self, key: PluginKey) -> list[_Element]:
        resolved = self._resolve(key) or key
        out: list[_Element] = [("device", *resolved)]
        device = self._by_key.get(resolved)
        if device is not None:
            out.extend(("counters", c.counter_set) for c in device.consumes_counters)
        return out

    def _footprint_of_name(self, name: str) -> list[_Element]:
        key = self._names.get(name)
        return self._footprint(key) if key is not None else [("name", name)]

    def _held(self) -> tuple[dict[_Element, Withheld], dict[_Element, Withheld]]:
        version = self.changes.version
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1], self._cache[2]
        by_plugin: dict[_Element, Withheld] = {}
        for key, holders in self._pods.items():
            why = Withheld("device-plugin", str(holders[0]))
            for element in self._footprint(key):
                by_plugin.setdefault(element, why)
        for key in self._allocated:
            why = Withheld("device-plugin", "an Allocate")
            for element in self._footprint(key):
                by_plugin.setdefault(element, why)
        by_dra: dict[_Element, Withheld] = {}
        for ref, names in (*self._claims_prepared.values(), *self._claims_allocated.values()):
            why = Withheld("dra", ref)
            for name in names:
                for element in self._footprint_of_name(name):
                    by_dra.setdefault(element, why)
        self._cache = (version, by_plugin, by_dra)
        return by_plugin, by_dra


def _first(footprint: Iterable[_Element], held: Mapping[_Element, Withheld]) -> Withheld | None:
    for element in footprint:
        why = held.get(element)
        if why is not None:
            return why
    return None
