"""Devices → ResourceSlices, and the writes that bring the API server's slices to them.

Pure: dicts in the resource.k8s.io/v1 JSON shape, no client, no I/O. The rules (dra.md §5-6):

* one pool per node, named after the node, with ``nodeName`` set and the Node as controlling
  owner (garbage-collected with it);
* at most 128 devices per slice, 64 when a device of the slice carries taints (so 64 whenever
  any device does: chunk sizes then do not flip with every health change of one device);
* a device's taints are the plugin's own (:attr:`devplug.models.Device.taints`), else
  ``<driver>/unhealthy`` (``NoSchedule``) while it is Unhealthy;
* shared counter sets (declared by devices, :attr:`devplug.models.Device.shared_counters`) go in
  slices of their own, at most 8 sets each, before the device slices (Kubernetes 1.35: a slice
  carries devices or sharedCounters, not both); 64 devices per slice when a device consumes
  counters; a device consuming from an undeclared set or counter is not published;
* every slice of a pool carries the pool's ``generation`` and ``resourceSliceCount``; consumers
  use only the highest generation and allocate nothing from an incomplete pool;
* the generation is kept when nothing is created, the slice count stays and at most one slice
  changes, and bumped otherwise (a reader never combines two slices written at different
  moments of one change, and a count is the same in every slice of a generation);
  it never goes down, even after every slice was deleted;
* slice ``i`` is named ``<hex i>-<driver>-<node>-<random>`` (the server completes the name), so
  its place in the pool is read back from its name, and lower indexes are allocated first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from devplug.models import MAX_ATTRIBUTE_VALUES, MAX_ATTRIBUTES, MAX_TAINTS, Version
from devplug.topology import NUMA_NODE_ATTRIBUTE

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from devplug._dra.inventory import Entry
    from devplug.models import AttributeValue, CounterSet, Device

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_TAINTED = 64
MAX_COUNTER_SETS = 8
ID_ATTRIBUTE = "id"
NUMA_ATTRIBUTE = "numaNode"
"""The first NUMA node in the driver's own domain: kept beside the standard
``resource.kubernetes.io/numaNode`` for selectors written before devplug published that."""
RESOURCE_ATTRIBUTE = "resourceName"
UNHEALTHY_TAINT = "unhealthy"
HELD_TAINT = "device-plugin"
"""``<driver>/device-plugin``: the device is held through the device-plugin API (both APIs
served, or a node moving to DRA), until the pod holding it ends."""


_LIST_FIELDS = {bool: "bools", int: "ints", str: "strings", Version: "versions"}
_LIST_KEYS = frozenset(_LIST_FIELDS.values())


def attribute(value: AttributeValue) -> dict[str, Any]:
    """One attribute value in the API's shape: exactly one of bool, int, string, version, or a
    list of one of them (bools, ints, strings, versions)."""
    if isinstance(value, tuple):
        field = _LIST_FIELDS[type(value[0])]
        return {field: [v.value if isinstance(v, Version) else v for v in value]}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def device_entry(
    entry: Entry,
    driver: str,
    *,
    taint_unhealthy: bool,
    effect_none: bool = True,
    shares: bool = True,
    lists: bool = False,
    held: bool = False,
) -> dict[str, Any]:
    """The ResourceSlice device for one inventory entry.

    The plugin's attributes and capacity, plus the original ID, the first NUMA node and the
    resource name (the plugin's own attributes of those names win). ``taint_unhealthy`` (the
    server keeps taints): the device's own taints, or for an Unhealthy device without any a
    ``NoSchedule`` taint ``<driver>/unhealthy``; otherwise no taints at all. ``effect_none``
    False (a server older than 1.35, which refuses the effect): taints of effect ``None`` are
    left out. ``shares`` False (a server without consumable capacity, which drops it): a shared
    device is published as an ordinary one, without ``allowMultipleAllocations`` and request
    policies. ``lists`` (the driver's ``list_attributes``, where the server keeps them): list
    attributes are published, and ``resource.kubernetes.io/numaNode`` lists every NUMA node of
    the device; otherwise list attributes are left out (:func:`list_attributes` names them) and
    ``numaNode`` is the first node. ``held`` (with ``taint_unhealthy``): a pod holds it through
    the device-plugin API, so it carries the ``NoSchedule`` taint ``<driver>/device-plugin``
    besides its own (the plugin's last taint gives way where there would be more than 16).

    Raises:
        ValueError: the device's attributes and capacities pass the API's limit of 32, or their
            values its limit of 48.
    """
    device = entry.device
    attributes, added = _attributes(entry, lists)
    if len(attributes) + len(device.capacity) > MAX_ATTRIBUTES:
        with_ours = f" (with {', '.join(added)})" if added else ""
        raise ValueError(
            f"device {device.id}: {len(attributes)} attributes{with_ours} "
            f"and {len(device.capacity)} capacities pass the limit of {MAX_ATTRIBUTES}"
        )
    out: dict[str, Any] = {"name": entry.name, "attributes": dict(sorted(attributes.items()))}
    if device.capacity:
        out["capacity"] = {name: _capacity(device, name, shares) for name in sorted(device.capacity)}
    if device.allow_multiple_allocations and shares:
        out["allowMultipleAllocations"] = True
    if device.binding_conditions:
        out["bindingConditions"] = list(device.binding_conditions)
        out["bindingFailureConditions"] = list(device.binding_failure_conditions)
    if device.binds_to_node:
        out["bindsToNode"] = True
    if device.consumes_counters:
        out["consumesCounters"] = [
            {"counterSet": c.counter_set, "counters": _counter_values(c.counters)}
            for c in device.consumes_counters
        ]
    if taint_unhealthy:
        taints = [t.as_dict() for t in device.taints if effect_none or t.effect != "None"]
        if not device.taints and not device.healthy:
            taints = [{"key": f"{driver}/{UNHEALTHY_TAINT}", "effect": "NoSchedule"}]
        if held:
            taints = [*taints[: MAX_TAINTS - 1], {"key": f"{driver}/{HELD_TAINT}", "effect": "NoSchedule"}]
        if taints:
            out["taints"] = taints
    return out


def _attributes(entry: Entry, lists: bool) -> tuple[dict[str, Any], list[str]]:
    """The device's attributes in the API's shape, devplug's own added, and the names added.

    Raises:
        ValueError: their values pass the API's limit of 48.
    """
    device = entry.device
    attributes: dict[str, Any] = {}
    if entry.plugin.dra_standard_attributes:
        attributes[ID_ATTRIBUTE] = {"string": device.id}
        attributes[RESOURCE_ATTRIBUTE] = {"string": entry.resource}
        if device.numa_nodes:
            attributes[NUMA_ATTRIBUTE] = {"int": device.numa_nodes[0]}
    if device.numa_nodes:
        # Kubernetes' own name, whatever the driver's attribute set: selectors and alignment
        # across drivers use it (a device's attribute of that name wins).
        numa = {"ints": list(device.numa_nodes)} if lists else {"int": device.numa_nodes[0]}
        attributes[NUMA_NODE_ATTRIBUTE] = numa
    added = [name for name in attributes if name not in device.attributes]
    attributes.update(
        (name, attribute(value))
        for name, value in device.attributes.items()
        if lists or not isinstance(value, tuple)
    )
    values = sum(len(next(iter(v.values()))) if is_list(v) else 1 for v in attributes.values())
    if values > MAX_ATTRIBUTE_VALUES:
        raise ValueError(
            f"device {device.id}: {values} attribute values pass the limit of {MAX_ATTRIBUTE_VALUES}"
        )
    return attributes, added


def is_list(value: object) -> bool:
    """Whether ``value``, an attribute in the API's shape, holds a list (bools, ints, ...)."""
    return isinstance(value, dict) and not _LIST_KEYS.isdisjoint(value)


def list_attributes(device: Device) -> list[str]:
    """The names of ``device``'s list attributes (left out where lists are not published)."""
    return [name for name, value in device.attributes.items() if isinstance(value, tuple)]


def _capacity(device: Device, name: str, shares: bool) -> dict[str, Any]:
    """One ``capacity`` entry: its value, and how claims consume it where the device is shared."""
    out: dict[str, Any] = {"value": device.capacity[name]}
    policy = device.request_policies.get(name)
    if policy is not None and shares:
        out["requestPolicy"] = policy.as_dict()
    return out


def schedulable(device: Device) -> bool:
    """Whether a scheduler may allocate ``device`` without a toleration: Healthy and no taint
    of effect ``NoSchedule`` or ``NoExecute`` (what is left out where taints cannot be published)."""
    return device.healthy and all(t.effect == "None" for t in device.taints)


class CounterSlice(list[dict[str, Any]]):
    """The ``sharedCounters`` of one slice (in :func:`chunks`' result, beside device lists)."""


def counter_set_entry(counter_set: CounterSet) -> dict[str, Any]:
    """One ``sharedCounters`` entry in the API's shape."""
    return {"name": counter_set.name, "counters": _counter_values(counter_set.counters)}


def _counter_values(counters: dict[str, str]) -> dict[str, Any]:
    return {name: {"value": value} for name, value in sorted(counters.items())}


def declared_counter_sets(devices: Iterable[Device]) -> tuple[list[CounterSet], list[str]]:
    """The distinct counter sets ``devices`` declare, by name, and the names declared differently
    by two devices (the first declaration is kept)."""
    sets: dict[str, CounterSet] = {}
    conflicts: list[str] = []
    for device in devices:
        for counter_set in device.shared_counters:
            known = sets.setdefault(counter_set.name, counter_set)
            if known != counter_set and counter_set.name not in conflicts:
                conflicts.append(counter_set.name)
    return [sets[n] for n in sorted(sets)], conflicts


def partition_type_problem(device: Device, name: str, driver: str) -> str | None:
    """Why ``device``, which consumes counters, cannot be published in a slice whose
    ``partitionTypeAttribute`` is ``name`` (qualified), or None: it must carry it as a string."""
    bare = name.removeprefix(f"{driver}/")
    value = device.attributes.get(name, device.attributes.get(bare))
    if value is None:
        return f"consumes counters but has no attribute {bare}, the driver's partition type attribute"
    if not isinstance(value, str):
        return f"its partition type attribute {bare} is {value!r}, not a string"
    return None


def consumption_problem(device: Device, sets: dict[str, CounterSet]) -> str | None:
    """Why ``device``'s counter consumption cannot be published with ``sets``, or None."""
    for consumption in device.consumes_counters:
        counter_set = sets.get(consumption.counter_set)
        if counter_set is None:
            return f"consumes from counter set {consumption.counter_set}, which no device declares"
        unknown = sorted(set(consumption.counters) - set(counter_set.counters))
        if unknown:
            return f"consumes counters {', '.join(unknown)} that set {counter_set.name} does not have"
    return None


def chunks(
    devices: Sequence[dict[str, Any]], counter_sets: Sequence[dict[str, Any]] = ()
) -> list[list[dict[str, Any]]]:
    """The counter sets (as :class:`CounterSlice` lists, first) and the devices split into slices;
    one empty slice for nothing at all (a pool has ≥ 1 slice)."""
    sets: list[list[dict[str, Any]]] = [
        CounterSlice(counter_sets[i : i + MAX_COUNTER_SETS])
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    limited = any("taints" in d or "consumesCounters" in d for d in devices)
    size = MAX_DEVICES_TAINTED if limited else MAX_DEVICES
    parts = [list(devices[i : i + size]) for i in range(0, len(devices), size)]
    return sets + parts or [[]]


def name_prefix(index: int, driver: str, node: str) -> str:
    """The generateName of slice ``index``: ``<5+ hex digits>-<driver>-<node>-`` (≤ 240 chars)."""
    return f"{index:05x}-{driver}-{node}"[:240] + "-"


def index_of(name: str, driver: str, node: str) -> int | None:
    """The index a slice name was generated for, or None if it is not one of ours."""
    head = name.partition("-")[0]
    try:
        index = int(head, 16)
    except ValueError:
        return None
    return index if name.startswith(name_prefix(index, driver, node)) else None


@dataclass
class Pool:
    """Where the slices go and who owns them."""

    driver: str
    node: str
    node_uid: str
    partition_type_attribute: str | None = None
    """The ``partitionTypeAttribute`` of the slices that hold devices consuming counters."""

    def slice_object(
        self, index: int, generation: int, count: int, devices: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A new slice (named by the server from its index)."""
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": name_prefix(index, self.driver, self.node),
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node,
                        "uid": self.node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": self.spec(generation, count, devices),
        }

    def spec(self, generation: int, count: int, devices: list[dict[str, Any]]) -> dict[str, Any]:
        """A slice's spec: ``devices``, or the counter sets of a :class:`CounterSlice`."""
        spec: dict[str, Any] = {
            "driver": self.driver,
            "nodeName": self.node,
            "pool": {"name": self.node, "generation": generation, "resourceSliceCount": count},
        }
        if isinstance(devices, CounterSlice):
            spec["sharedCounters"] = list(devices)
        else:
            spec["devices"] = devices
            if self.partition_type_attribute and any("consumesCounters" in d for d in devices):
                spec["partitionTypeAttribute"] = self.partition_type_attribute
        return spec


@dataclass
class Plan:
    """The writes that make the API server's slices match the wanted devices."""

    generation: int
    delete: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)
    create: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.delete or self.update or self.create)


def comparable(spec: dict[str, Any]) -> dict[str, Any]:
    """A slice spec without what the API server fills in by itself (a taint's ``timeAdded``)."""
    if "devices" not in spec:
        return spec
    devices = []
    for device in spec.get("devices") or ():
        taints = device.get("taints")
        if taints:
            devices.append(
                {**device, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints]}
            )
        else:
            devices.append(device)
    return {**spec, "devices": devices}


def plan(
    pool: Pool, wanted: list[list[dict[str, Any]]], existing: Sequence[dict[str, Any]], last_generation: int
) -> Plan:
    """The writes from ``existing`` (every slice of this driver on this node) to ``wanted``.

    ``last_generation``: the highest generation this process has written, so that a pool
    re-created after its slices were wiped never goes back to an older generation.
    """
    ours: dict[int, dict[str, Any]] = {}
    obsolete: list[dict[str, Any]] = []
    current = max([s["spec"]["pool"].get("generation", 0) for s in existing if _pool(s) == pool.node] or [0])
    for item in sorted(existing, key=lambda s: s["metadata"].get("creationTimestamp", "")):
        index = index_of(item["metadata"]["name"], pool.driver, pool.node)
        spec = item["spec"]
        if (
            index is None
            or index >= len(wanted)
            or _pool(item) != pool.node
            or spec["pool"].get("generation", 0) < current
            or index in ours
        ):
            obsolete.append(item)
        else:
            ours[index] = item
    count = len(wanted)
    generation = max(current, last_generation)
    specs = {i: pool.spec(generation, count, devices) for i, devices in enumerate(wanted)}
    changed = [i for i, item in ours.items() if comparable(item["spec"]) != specs[i]]
    missing = [i for i in range(count) if i not in ours]
    recounted = any(item["spec"]["pool"].get("resourceSliceCount") != count for item in ours.values())
    if missing or recounted or len(changed) > 1 or generation != current:
        generation += 1
        specs = {i: pool.spec(generation, count, devices) for i, devices in enumerate(wanted)}
        changed = sorted(ours)
    result = Plan(generation, delete=obsolete)
    for i in changed:
        item = ours[i]
        result.update.append({**item, "spec": specs[i]})
    for i in missing:
        result.create.append(pool.slice_object(i, generation, count, wanted[i]))
    return result


def _pool(item: dict[str, Any]) -> str:
    return str(item["spec"].get("pool", {}).get("name", ""))
