"""The data a plugin author handles: devices, their health, and what a container gets.

Pure data: pydantic models with no I/O and no protobuf. The servicer converts these to and
from the wire types; nothing else in devplug touches protobuf.
"""

# No ``from __future__ import annotations`` here: pydantic would compile every field's annotation
# string when each class is made, milliseconds of every start (see bench/startup.py).

import enum
import re
import warnings
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from devplug._names import LABEL_MAX, QUALIFIED_NAME, is_dns_label, is_dns_subdomain, is_qualified_name
from devplug._quantity import QUANTITY, quantity
from devplug._resource_claim import ResourceClaimDict

__all__ = [
    "AllocatedDevice",
    "AttributeValue",
    "CapacityRequestPolicy",
    "CdiSpecFile",
    "Claim",
    "ClaimRef",
    "ContainerAllocation",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceCondition",
    "DeviceSpec",
    "DeviceStatus",
    "DeviceTaint",
    "Health",
    "Mount",
    "NetworkData",
    "OpaqueConfig",
    "PluginOptions",
    "PreparedDevice",
    "ResourceClaimDict",
    "Version",
]

# DRA's limits (resource.k8s.io/v1): a device has at most 32 attributes and capacities together;
# a name is a C identifier of at most 32 characters, optionally behind a DNS-subdomain domain
# of at most 63 and a slash; a string or version value has at most 64 characters.
MAX_ATTRIBUTES = 32
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
# Semantic Versioning 2.0.0, as the API server checks a version attribute.
_NUM = r"(0|[1-9][0-9]*)"
_PRE = r"(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(rf"{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?")
# Taints per device: 16 from Kubernetes 1.35 (1.34 accepted 4).
MAX_TAINTS = 16
# Counters (Kubernetes 1.35): a set or a consumption has 1 to 32 counters named by DNS labels; a
# device consumes from at most 2 sets.
MAX_COUNTERS = 32
MAX_CONSUMPTIONS = 2
# Consumable capacity (Kubernetes 1.36+): a request policy offers at most 10 valid values.
MAX_VALID_VALUES = 10
# Binding conditions (Kubernetes 1.36+): at most 4 of each kind per device.
MAX_BINDING_CONDITIONS = 4
# A Kubernetes quantity: a decimal number with an optional binary, decimal or exponent suffix.


class Health(str, enum.Enum):
    """Device health as the kubelet reads it: only ``"Healthy"`` counts as allocatable."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"

    def __str__(self) -> str:
        return self.value


class _Frozen(BaseModel):
    # Built at first use: a device plugin never builds the DRA models, and the Allocate answer's
    # models are built when the first Allocate comes, not before the plugin registers.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Version(_Frozen):
    """A semantic-version attribute value (DRA's ``version``): ``Version("12.4.0")``."""

    value: str

    def __init__(self, value: str, /) -> None:
        super().__init__(**{"value": value})

    @field_validator("value")
    @classmethod
    def _semver(cls, value: str) -> str:
        if len(value) > 64 or not _SEMVER.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a semantic version (MAJOR.MINOR.PATCH, at most 64 characters)"
            )
        return value

    def __str__(self) -> str:
        return self.value


AttributeValue = (
    bool | int | str | Version | tuple[bool, ...] | tuple[int, ...] | tuple[str, ...] | tuple[Version, ...]
)
"""A DRA device attribute: a boolean, an integer, a string (at most 64 characters) or a
:class:`Version`; or a non-empty list of one of them (KEP-5491, published only where the driver
opts in with ``list_attributes``). Written in CEL as ``device.attributes["<driver>"].<name>``."""
# A device's attribute values together (a list counts each of its values): the API's limit.
MAX_ATTRIBUTE_VALUES = 48


def _lists_as_tuples(attributes: Any) -> Any:
    """Attribute lists as tuples, so that each matches its own member of the union strictly
    (``[0, 1]`` stays integers, never booleans)."""
    if not isinstance(attributes, dict):
        return attributes
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attributes.items()}


def check_attribute_name(name: str) -> str:
    """Return ``name`` if it is a valid DRA attribute or capacity name, else raise ValueError."""
    domain, slash, ident = name.rpartition("/")
    valid = _IDENT.fullmatch(ident) is not None and (not slash or is_dns_subdomain(domain, 63))
    if not valid:
        raise ValueError(
            f"invalid attribute name {name!r}: a C identifier of at most 32 characters, "
            "optionally behind a DNS domain of at most 63 characters and '/'"
        )
    return name


TaintEffect = Literal["None", "NoSchedule", "NoExecute"]
"""A DRA device taint's effect: ``NoSchedule`` (no new allocation without a toleration),
``NoExecute`` (also evicts pods that do not tolerate it) or ``None`` (informational only;
accepted by the API server from Kubernetes 1.35)."""


class DeviceTaint(_Frozen):
    """A DRA taint on a device (``resource.k8s.io/v1`` ``DeviceTaint``), published in its slice.

    ``DeviceTaint("gpu.nvidia.com/xid", "79")``; the device-plugin API ignores taints.
    """

    key: str
    """A label name: ``name`` or ``prefix/name``, the prefix a DNS subdomain (``example.com/overheated``)."""
    value: str = ""
    """A label value (at most 63 characters; may be empty)."""
    effect: TaintEffect = "NoSchedule"
    """What the taint does to claims that do not tolerate it."""

    def __init__(self, key: str, value: str = "", effect: TaintEffect = "NoSchedule", /) -> None:
        super().__init__(**{"key": key, "value": value, "effect": effect})

    @field_validator("key")
    @classmethod
    def _label_name(cls, key: str) -> str:
        # A label name: an optional DNS-subdomain prefix and '/', then a name of at most 63.
        if not is_qualified_name(key):
            raise ValueError(
                f"invalid taint key {key!r}: a name of at most 63 characters (letters, digits, '-', '_', "
                "'.', starting and ending with a letter or digit), optionally behind a DNS subdomain and '/'"
            )
        return key

    @field_validator("value")
    @classmethod
    def _label_value(cls, value: str) -> str:
        # A label value: at most 63, the characters of a label name.
        if value and not (len(value) <= LABEL_MAX and QUALIFIED_NAME.fullmatch(value)):
            raise ValueError(
                f"invalid taint value {value!r}: at most 63 characters (letters, digits, '-', '_', '.', "
                "starting and ending with a letter or digit)"
            )
        return value

    def as_dict(self) -> dict[str, str]:
        """The taint in the API's JSON shape (``value`` left out when empty)."""
        out = {"key": self.key, "value": self.value, "effect": self.effect}
        if not self.value:
            del out["value"]
        return out


def _quantity_text(value: Any, what: str) -> str:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not QUANTITY.fullmatch(text):
        raise ValueError(f"{what}: {value!r} is not a Kubernetes quantity (e.g. 40Gi, 8, 500m)")
    return text


def _counters(counters: Any) -> Any:
    """Counter names (DNS labels) and values (quantities; integers written as quantities)."""
    if not isinstance(counters, dict):
        return counters
    if not 1 <= len(counters) <= MAX_COUNTERS:
        raise ValueError(f"1 to {MAX_COUNTERS} counters, got {len(counters)}")
    out = {}
    for name, value in counters.items():
        if not isinstance(name, str) or not is_dns_label(name):
            raise ValueError(f"counter name {name!r} is not a DNS label (lowercase letters, digits and '-')")
        out[name] = _quantity_text(value, f"counter {name}")
    return out


def _counter_set_name(name: str) -> str:
    if not is_dns_label(name):
        raise ValueError(f"counter set name {name!r} is not a DNS label")
    return name


_CounterSetName = Annotated[str, AfterValidator(_counter_set_name)]
_Counters = Annotated[dict[str, str], BeforeValidator(_counters)]


class CounterSet(_Frozen):
    """Counters shared by several devices of a pool (``sharedCounters``, Kubernetes 1.35+): what
    the devices that consume from it may take together, e.g. a GPU's multiprocessors and memory
    slices, consumed by its partitions."""

    name: _CounterSetName
    """The set's name, unique in the pool (a DNS label, e.g. ``gpu-0-counter-set``)."""
    counters: _Counters
    """Counter name (a DNS label) → how much there is (a quantity; integers accepted)."""

    def __hash__(self) -> int:
        return hash((self.name, tuple(self.counters.items())))


class CounterConsumption(_Frozen):
    """What a device takes from a :class:`CounterSet` of its pool while allocated
    (``consumesCounters``)."""

    counter_set: _CounterSetName
    """The name of the set consumed from."""
    counters: _Counters
    """Counter name → how much the device takes (a quantity; integers accepted)."""

    def __hash__(self) -> int:
        return hash((self.counter_set, tuple(self.counters.items())))


def _policy_quantity(value: Any) -> Any:
    return None if value is None else _quantity_text(value, "request policy")


_PolicyQuantity = Annotated[str, BeforeValidator(_policy_quantity)]


class CapacityRequestPolicy(_Frozen):
    """How claims consume one capacity of a shared device (``requestPolicy``, consumable capacity,
    Kubernetes 1.36+): what a claim that names no amount takes, and which amounts are valid.

    Give ``valid_values`` (ascending, at most 10, ``default`` among them) or a range (``min``,
    optional ``max`` and ``step``; ``default`` within it and on a step), or neither (any amount
    up to what is left). The scheduler rounds a request up to the next valid amount and refuses
    one above them all. Quantities; integers accepted.
    """

    default: _PolicyQuantity | None = None
    """What a claim that does not ask for this capacity consumes (required with ``valid_values``
    or a range); without any policy a claim takes all of it."""
    valid_values: tuple[_PolicyQuantity, ...] = ()
    """The amounts a claim may consume (``validValues``)."""
    min: _PolicyQuantity | None = None
    """The smallest amount (``validRange.min``); set it to give a range."""
    max: _PolicyQuantity | None = None
    """The largest amount (``validRange.max``; default: the capacity)."""
    step: _PolicyQuantity | None = None
    """Valid amounts are ``min + n * step`` (``validRange.step``)."""

    @model_validator(mode="after")
    def _one_kind(self) -> "CapacityRequestPolicy":
        ranged = self.max is not None or self.step is not None
        if self.valid_values and (self.min is not None or ranged):
            raise ValueError("give valid_values or a range (min, max, step), not both")
        if ranged and self.min is None:
            raise ValueError("a range needs its min")
        if (self.valid_values or self.min is not None) and self.default is None:
            raise ValueError("a policy with valid values or a range needs a default")
        if len(self.valid_values) > MAX_VALID_VALUES:
            raise ValueError(f"at most {MAX_VALID_VALUES} valid values")
        return self

    def check(self, name: str, capacity: str) -> None:
        """Raise what the API server would reject of this policy for the capacity ``name`` of
        value ``capacity`` (checked where the device is made, not when the slice is refused).

        Raises:
            ValueError: the message names the capacity and the rule.
        """
        total = quantity(capacity)
        where = f"capacity {name} ({capacity}): request policy"
        if self.valid_values:
            self._check_values(where, total)
        if self.min is not None:
            self._check_range(where, total)

    def _check_values(self, where: str, total: Decimal) -> None:
        values = [quantity(v) for v in self.valid_values]
        if values != sorted(values):
            raise ValueError(f"{where}: valid values must be in ascending order")
        if len(set(values)) != len(values):
            raise ValueError(f"{where}: a valid value is given twice")
        if values[-1] > total:
            raise ValueError(f"{where}: valid value {self.valid_values[-1]} is larger than the capacity")
        if self.default is not None and quantity(self.default) not in values:
            raise ValueError(f"{where}: default {self.default} is not one of the valid values")

    def _check_range(self, where: str, total: Decimal) -> None:
        low, default = quantity(self.min), quantity(self.default)
        high = total if self.max is None else quantity(self.max)
        if low < 0:
            raise ValueError(f"{where}: min {self.min} is negative")
        if low > total:
            raise ValueError(f"{where}: min {self.min} is larger than the capacity")
        if high > total:
            raise ValueError(f"{where}: max {self.max} is larger than the capacity")
        if low > high:
            raise ValueError(f"{where}: min {self.min} is larger than max {self.max}")
        if not low <= default <= high:
            raise ValueError(f"{where}: default {self.default} is outside min {self.min} and max {high}")
        if self.step is None:
            return
        step = quantity(self.step)
        if step <= 0:
            raise ValueError(f"{where}: step {self.step} must be greater than zero")
        if low + step > total:
            raise ValueError(f"{where}: one step from min ({self.min} + {self.step}) passes the capacity")
        for label, value in (("default", default), ("max", None if self.max is None else high)):
            if value is not None and (value - low) % step:
                raise ValueError(f"{where}: {label} is not min plus a multiple of step {self.step}")

    def as_dict(self) -> dict[str, Any]:
        """The policy in the API's JSON shape (``requestPolicy``)."""
        out: dict[str, Any] = {}
        if self.default is not None:
            out["default"] = self.default
        if self.valid_values:
            out["validValues"] = list(self.valid_values)
        if self.min is not None:
            bounds = {"min": self.min, "max": self.max, "step": self.step}
            out["validRange"] = {k: v for k, v in bounds.items() if v is not None}
        return out

    def __hash__(self) -> int:
        return hash((self.default, self.valid_values, self.min, self.max, self.step))


def _check_binding_conditions(conditions: tuple[str, ...], failures: tuple[str, ...]) -> None:
    """The API server's rules for a device's binding conditions (raised as the model's error)."""
    for label, names in (("binding_conditions", conditions), ("binding_failure_conditions", failures)):
        if len(names) > MAX_BINDING_CONDITIONS:
            raise ValueError(f"at most {MAX_BINDING_CONDITIONS} {label}, got {len(names)}")
        for name in names:
            if not is_qualified_name(name):
                raise ValueError(f"{label}: {name!r} is not a condition type (a qualified name)")
        if len(set(names)) != len(names):
            raise ValueError(f"{label}: a condition is named twice")
    both = sorted(set(conditions) & set(failures))
    if both:
        raise ValueError(f"condition {both[0]} is both a binding condition and a binding failure condition")
    if bool(conditions) != bool(failures):
        raise ValueError("binding_conditions and binding_failure_conditions go together: both or neither")


class Device(_Frozen):
    """One schedulable unit of a resource, as listed to the kubelet.

    ``numa_node=N`` is accepted as a shorthand for ``numa_nodes=(N,)``; ``None`` or an
    empty tuple means no NUMA affinity (the kubelet treats both the same).
    ``attributes`` and ``capacity`` describe the device to DRA (selectors in claims and device
    classes); the device-plugin API ignores them.
    """

    id: str = Field(min_length=1)
    """The device ID the kubelet schedules and later passes back to ``allocate``."""
    health: Health = Health.HEALTHY
    """Whether the kubelet may hand this device to new containers."""
    health_message: str = ""
    """Why the device has its health, in a sentence (``"XID 79: the GPU fell off the bus"``).
    DRA sends it with the health (a kubelet >= 1.36 shows it in the pod's status, cut at 1024
    bytes); an Unhealthy device without one is sent with a message saying the plugin gave no
    reason. The device-plugin API has no place for it."""
    numa_nodes: tuple[int, ...] = ()
    """The host NUMA nodes the device is attached to; empty for no topology."""
    attributes: Annotated[dict[str, AttributeValue], BeforeValidator(_lists_as_tuples)] = Field(
        default_factory=dict
    )
    """DRA attributes by name (``model``, ``example.com/firmware``): bool, int, str or Version.
    A name without a domain belongs to the driver's domain."""
    capacity: dict[str, str] = Field(default_factory=dict)
    """DRA capacities by name, as Kubernetes quantities (``"40Gi"``, ``"8"``); integers are
    accepted and written as quantities."""
    name: str | None = None
    """DRA: the device's name in ResourceSlices (a DNS label, e.g. ``gpu-0``); default: derived
    from ``id`` (kept when it is a DNS label already)."""
    taints: tuple[DeviceTaint, ...] = ()
    """DRA: the device's taints (at most 16), published with it; empty: devplug taints an
    Unhealthy device ``<driver>/unhealthy`` (``NoSchedule``) by itself. The device-plugin API
    ignores them."""
    consumes_counters: tuple[CounterConsumption, ...] = ()
    """DRA: what the device takes from shared counter sets while allocated (at most 2 sets,
    each named once); every set must be declared by some device's ``shared_counters``."""
    shared_counters: tuple[CounterSet, ...] = ()
    """DRA: counter sets this device declares for the pool (published once, in slices of their
    own; several devices may declare the same set, identically)."""
    allow_multiple_allocations: bool = False
    """DRA: the device is shared: several claims may be allocated to it at once, each a share
    (its own ``share_id``) consuming part of its ``capacity`` (consumable capacity, Kubernetes
    1.36+, ``allowMultipleAllocations``). Unshared devices go to one claim at a time."""
    request_policies: dict[str, CapacityRequestPolicy] = Field(default_factory=dict)
    """DRA, shared devices: how claims consume each capacity, by capacity name (a capacity
    without one is taken whole by a claim that does not ask for an amount)."""
    binding_conditions: tuple[str, ...] = ()
    """DRA: conditions (condition types, e.g. ``example.com/attached``) that a controller of the
    driver must set True in the claim's ``status.devices`` before the scheduler binds a pod
    using this device (binding conditions, Kubernetes 1.36+; at most 4). Needs
    ``binding_failure_conditions`` too."""
    binding_failure_conditions: tuple[str, ...] = ()
    """DRA: conditions that, set True by that controller, fail the binding (at most 4, none of
    them a binding condition); the scheduler then allocates the claim anew."""
    binds_to_node: bool = False
    """DRA: a claim allocated this device is bound to the node it was allocated on (the
    scheduler sets the allocation's node selector), as a device attached to a node by a
    controller is."""

    @model_validator(mode="before")
    @classmethod
    def _numa_node_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "numa_node" in data:
            data = dict(data)
            node = data.pop("numa_node")
            if "numa_nodes" in data:
                raise ValueError("give numa_node or numa_nodes, not both")
            data["numa_nodes"] = () if node is None or node < 0 else (node,)
        return data

    @field_validator("numa_nodes")
    @classmethod
    def _non_negative(cls, nodes: tuple[int, ...]) -> tuple[int, ...]:
        if any(n < 0 for n in nodes):
            raise ValueError("NUMA node IDs are non-negative host node numbers")
        return nodes

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str | None) -> str | None:
        if name is not None and not is_dns_label(name):
            raise ValueError(f"{name!r} is not a DNS label (lowercase letters, digits and '-', at most 63)")
        return name

    @field_validator("attributes")
    @classmethod
    def _attributes(cls, attributes: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
        count = 0
        for name, value in attributes.items():
            check_attribute_name(name)
            values = value if isinstance(value, tuple) else (value,)
            if not values:
                raise ValueError(f"attribute {name}: a list has at least one value")
            if len({type(v) for v in values}) > 1:
                raise ValueError(f"attribute {name}: a list holds values of one type")
            if any(isinstance(v, str) and len(v) > 64 for v in values):
                raise ValueError(f"attribute {name}: a string value has at most 64 characters")
            count += len(values)
        if count > MAX_ATTRIBUTE_VALUES:
            raise ValueError(
                f"a device has at most {MAX_ATTRIBUTE_VALUES} attribute values, lists counted by value"
            )
        return attributes

    @field_validator("capacity", mode="before")
    @classmethod
    def _quantities(cls, capacity: Any) -> Any:
        if not isinstance(capacity, dict):
            return capacity
        out = {}
        for name, value in capacity.items():
            check_attribute_name(str(name))
            out[name] = _quantity_text(value, f"capacity {name}")
        return out

    @model_validator(mode="after")
    def _dra_limits(self) -> "Device":
        if len(self.attributes) + len(self.capacity) > MAX_ATTRIBUTES:
            raise ValueError(f"a device has at most {MAX_ATTRIBUTES} attributes and capacities together")
        if len(self.taints) > MAX_TAINTS:
            raise ValueError(f"a device has at most {MAX_TAINTS} taints")
        sets = [c.counter_set for c in self.consumes_counters]
        if len(sets) > MAX_CONSUMPTIONS or len(set(sets)) != len(sets):
            raise ValueError(f"a device consumes from at most {MAX_CONSUMPTIONS} counter sets, each once")
        _check_binding_conditions(self.binding_conditions, self.binding_failure_conditions)
        if self.request_policies and not self.allow_multiple_allocations:
            raise ValueError("request_policies need allow_multiple_allocations (shared devices have them)")
        for name, policy in self.request_policies.items():
            if name not in self.capacity:
                raise ValueError(f"request policy for {name}, which is not one of the device's capacities")
            policy.check(name, self.capacity[name])
        return self

    def __hash__(self) -> int:
        attributes, capacity = tuple(self.attributes.items()), tuple(self.capacity.items())
        return hash(
            (
                self.id,
                self.health,
                self.numa_nodes,
                attributes,
                capacity,
                self.name,
                self.taints,
                self.consumes_counters,
                self.shared_counters,
                self.allow_multiple_allocations,
                tuple(self.request_policies.items()),
                self.binding_conditions,
                self.binding_failure_conditions,
                self.binds_to_node,
            )
        )

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    def with_health(self, health: Health, message: str = "") -> "Device":
        """A copy of this device with another health, and ``message`` saying why (the
        device's ``health_message``; empty: none)."""
        return self.model_copy(update={"health": health, "health_message": message})


class DeviceSpec(_Frozen):
    """A device node to create in the container (``ContainerAllocateResponse.devices``)."""

    container_path: str
    """Path of the node inside the container."""
    host_path: str
    """Path of the node on the host."""
    permissions: str = "rw"
    """cgroup permissions: any of ``r`` (read), ``w`` (write), ``m`` (mknod)."""

    @field_validator("permissions")
    @classmethod
    def _permissions(cls, value: str) -> str:
        if not value or set(value) - set("rwm") or len(set(value)) != len(value):
            raise ValueError(f"permissions must be a combination of 'r', 'w', 'm', got {value!r}")
        return value

    @classmethod
    def rw(cls, host_path: str, container_path: str | None = None) -> "DeviceSpec":
        """The same node at the same path (or ``container_path``), read-write."""
        return cls(host_path=host_path, container_path=container_path or host_path, permissions="rw")


class Mount(_Frozen):
    """A host path bind-mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool = False


def _qualified_cdi_names(names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        kind, sep, device = name.partition("=")
        if not sep or "/" not in kind or not device:
            raise ValueError(f"CDI device name {name!r} is not fully qualified (vendor.com/class=name)")
    return names


_CdiNames = Annotated[tuple[str, ...], AfterValidator(_qualified_cdi_names)]
"""Fully qualified CDI device names, as both APIs hand them to the container runtime."""


class ContainerAllocation(_Frozen):
    """What one container gets for the devices it was given (one ``ContainerAllocateResponse``).

    The kubelet checkpoints this and replays it on container restarts without calling
    ``allocate`` again: put no one-time secrets here.
    """

    envs: dict[str, str] = Field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = Field(default_factory=dict)
    cdi_devices: _CdiNames = ()
    """Fully qualified CDI device names (``vendor.com/class=name``)."""


class PluginOptions(_Frozen):
    """The options advertised to the kubelet, derived from which hooks a plugin overrides."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


# -- DRA: claims and what preparing them returns (devplug.dra) ----------------------------------


if TYPE_CHECKING:
    _ResourceClaim = ResourceClaimDict
else:
    # pydantic checks the object as the plain dict it is at run time: as a TypedDict it would be
    # validated field by field on every prepare, and the fields it does not name dropped.
    _ResourceClaim = dict[str, Any]


class Claim(_Frozen):
    """A ResourceClaim the kubelet asks the driver to prepare or unprepare."""

    uid: str
    namespace: str
    name: str
    resource_claim: _ResourceClaim | None = None
    """The ResourceClaim object as read from the API server at prepare, every field kept (None
    at unprepare: the claim may be gone by then, and unprepare never reads the API). Typed as a
    :class:`ResourceClaimDict`: ``claim.resource_claim["status"]["allocation"]`` and so on."""


class ClaimRef(NamedTuple):
    """A claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources.

    A tuple, so that a plain ``(namespace, name, uid)`` stands for one: the fake kubelet's
    calls take either. ``str()`` gives ``namespace/name``.
    """

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class AllocatedDevice(_Frozen):
    """One device the scheduler allocated to a claim, as this driver serves it."""

    request: str
    """The claim's request it satisfies: ``gpu``, or ``gpu/small`` for a subrequest."""
    name: str
    """The device's name in the ResourceSlice (a DNS label)."""
    pool: str
    """The pool it was published in (the node's name)."""
    device: Device
    """The plugin's device (as last listed by ``watch_devices``)."""
    admin_access: bool = False
    """Allocated for administrative access: the device may be in use by other claims."""
    share_id: str | None = None
    """The share of a shared device (:attr:`Device.allow_multiple_allocations`) this claim has:
    the scheduler's ID for it, unique among the device's allocations; None for a device given
    whole."""
    consumed_capacity: dict[str, str] = Field(default_factory=dict)
    """What the share consumes of the device's capacities, by capacity name (quantities as the
    scheduler wrote them, its request policy's rounding applied); empty for a device given whole."""
    other_shares: tuple[str, ...] = ()
    """The device's shares already prepared for other claims on this node when this prepare
    began. Empty: no other claim uses the device, so set up what the device needs as a whole
    here (and undo it in :meth:`~devplug.DevicePlugin.release_device`)."""

    @property
    def request_name(self) -> str:
        """The request as containers reference it: ``gpu/small`` reduced to ``gpu``."""
        return self.request.partition("/")[0]


class OpaqueConfig(_Frozen):
    """A driver configuration from the device class or the claim, for this driver only.

    Given to :meth:`~devplug.DevicePlugin.prepare_claim` in order of precedence: class configs
    before claim configs, each in its listed order, so that a later entry overrides an earlier
    one.
    """

    source: Literal["FromClass", "FromClaim"]
    requests: tuple[str, ...] = ()
    """The requests it applies to; empty: every request of the claim."""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """The opaque parameters (any JSON object; for example ``apiVersion``, ``kind`` and fields)."""

    def applies_to(self, request: str) -> bool:
        """Whether this config covers ``request`` (``gpu`` covers its subrequests ``gpu/...``)."""
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


_SPEC_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,250}\.(json|yaml)")


class CdiSpecFile(_Frozen):
    """A finished CDI spec file, its name and its text, that a ``prepare_claim`` hook hands over
    for devplug to write with the claim.

    Not :class:`devplug.cdi.CdiSpec`: that is a spec's content as a model, which devplug renders,
    names and writes itself (for :meth:`~devplug.DevicePlugin.cdi_spec`, and for a claim's
    default preparation). A hook renders its own spec however it likes (``CdiSpec.to_json()``,
    or YAML of its own) and hands over the file. devplug writes it (atomically) into the CDI
    directory before the kubelet is answered and records it in the driver's checkpoint with the
    claim: a repeated prepare writes it again when it has gone missing (a reboot empties
    ``/var/run/cdi``), and unprepare removes it.
    """

    name: str
    """The file's name in the CDI directory, ending in ``.json`` or ``.yaml`` (the format of
    ``text``), e.g. ``k8s.gpu.nvidia.com-claim_<uid>.yaml``; no directories."""
    text: str
    """The file's content."""

    @field_validator("name")
    @classmethod
    def _file_name(cls, name: str) -> str:
        if not _SPEC_FILE.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a CDI spec file name: letters, digits, '.', '_' and '-', "
                "ending in .json or .yaml, no directories"
            )
        return name


_RENAMED_PREPARED_FIELDS = {"cdi_device_ids": "cdi_devices", "cdi_spec": "cdi_spec_file"}


def _renamed(model: str, old: str, new: str, *, depth: int) -> None:
    """Warn that ``old`` is now ``new``, naming the line ``depth`` calls above the caller."""
    warnings.warn(f"{model}.{old} is deprecated: use {new}", DeprecationWarning, stacklevel=depth + 2)


_CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
# Claim device status (KEP-4817): the API server's limits.
MAX_DEVICE_CONDITIONS = 8
MAX_DEVICE_DATA_BYTES = 10 * 1024
MAX_NETWORK_IPS = 16


class DeviceCondition(_Frozen):
    """One condition of a prepared device, as the claim's ``status.devices[].conditions`` shows
    it (a Kubernetes condition; devplug sets ``lastTransitionTime`` when it first writes it)."""

    type: str
    """A condition type: a qualified name (``Ready``, ``example.com/LinkUp``)."""
    status: Literal["True", "False", "Unknown"]
    reason: str
    """One CamelCase word (letters, digits, ``_``, ``,`` and ``:``; at most 1024 characters)."""
    message: str = Field(default="", max_length=32 * 1024)
    observed_generation: int | None = Field(default=None, ge=0)
    """The claim's ``metadata.generation`` the condition was set for, if it matters."""

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if not is_qualified_name(value):
            raise ValueError(
                f"condition type {value!r} is not a qualified name (optional domain and '/', a name)"
            )
        return value

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if len(value) > 1024 or not _CONDITION_REASON.fullmatch(value):
            raise ValueError(
                f"condition reason {value!r}: one word of letters, digits and '_,:', starting with a letter"
            )
        return value


class NetworkData(_Frozen):
    """What a network device looks like to the pod (``networkData``), e.g. from a CNI plugin."""

    interface_name: str = Field(default="", max_length=256)
    """The interface's name in the pod's network namespace."""
    ips: tuple[str, ...] = ()
    """Its addresses with prefix lengths, in canonical form (``10.9.8.7/24``, ``2001:db8::1/64``)."""
    hardware_address: str = Field(default="", max_length=128)
    """Its MAC address (or another hardware address)."""

    @field_validator("ips")
    @classmethod
    def _ips(cls, ips: tuple[str, ...]) -> tuple[str, ...]:
        import ipaddress

        if len(ips) > MAX_NETWORK_IPS:
            raise ValueError(f"at most {MAX_NETWORK_IPS} addresses")
        if len(set(ips)) != len(ips):
            raise ValueError("an address is given twice")
        for ip in ips:
            try:
                interface = ipaddress.ip_interface(ip)
            except ValueError:
                interface = None
            canonical = f"{interface.ip}/{interface.network.prefixlen}" if interface else None
            if interface is None or "/" not in ip:
                raise ValueError(f"{ip!r} is not an address with its prefix length (10.9.8.7/24)")
            if ip != canonical:
                raise ValueError(f"{ip!r} is not in canonical form ({canonical!r})")
        return ips


class DeviceStatus(_Frozen):
    """What a driver reports about a device it prepared (claim device status, GA in Kubernetes
    1.37): devplug writes it to the claim's ``status.devices`` after the prepare, where users,
    controllers and ``kubectl describe`` read it, and removes it at unprepare."""

    conditions: tuple[DeviceCondition, ...] = ()
    """At most 8, each type once."""
    data: dict[str, Any] | None = None
    """Driver-specific details, any JSON object of at most 10 KiB."""
    network_data: NetworkData | None = None

    @model_validator(mode="after")
    def _limits(self) -> "DeviceStatus":
        types = [c.type for c in self.conditions]
        if len(types) > MAX_DEVICE_CONDITIONS:
            raise ValueError(f"at most {MAX_DEVICE_CONDITIONS} conditions")
        if len(set(types)) != len(types):
            raise ValueError("a condition type is given twice")
        if self.data is not None:
            import json

            try:
                size = len(json.dumps(self.data, separators=(",", ":")).encode())
            except (TypeError, ValueError) as exc:
                raise ValueError(f"data is not JSON: {exc}") from None
            if size > MAX_DEVICE_DATA_BYTES:
                raise ValueError(f"data takes {size} bytes as JSON, more than {MAX_DEVICE_DATA_BYTES}")
        return self

    def as_dict(self, transition_time: str) -> dict[str, Any]:
        """The status in the API's JSON shape (without the device's names), its conditions
        stamped ``transition_time`` (RFC 3339)."""
        out: dict[str, Any] = {}
        if self.conditions:
            out["conditions"] = [
                {
                    "type": c.type,
                    "status": c.status,
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": transition_time,
                    **(
                        {"observedGeneration": c.observed_generation}
                        if c.observed_generation is not None
                        else {}
                    ),
                }
                for c in self.conditions
            ]
        if self.data is not None:
            out["data"] = self.data
        if self.network_data is not None:
            network = {
                "interfaceName": self.network_data.interface_name,
                "ips": list(self.network_data.ips),
                "hardwareAddress": self.network_data.hardware_address,
            }
            out["networkData"] = {k: v for k, v in network.items() if v}
        return out


class PreparedDevice(_Frozen):
    """What :meth:`~devplug.DevicePlugin.prepare_claim` returns per allocated device.

    The old field names ``cdi_device_ids`` and ``cdi_spec`` are still accepted, and read, with a
    DeprecationWarning.
    """

    name: str
    """The device's name in the ResourceSlice (:attr:`AllocatedDevice.name`)."""
    requests: tuple[str, ...] = ()
    """The requests it serves (empty: every request of the claim that uses it)."""
    cdi_devices: _CdiNames = ()
    """Fully qualified CDI device names (``vendor.com/class=name``) the runtime applies to every
    container that uses the device; their specs must exist before the container starts. The
    same as :attr:`ContainerAllocation.cdi_devices`."""
    cdi_spec_file: CdiSpecFile | None = None
    """A spec file defining ``cdi_devices`` for devplug to write, keep and remove with the
    claim (instead of the hook writing one itself). Devices of one claim may carry the same
    file (same name, same text); a claim has at most one such file."""
    share_id: str | None = None
    """Which share this answer is for, where the claim has the same device twice (two requests,
    each a share of it: :attr:`AllocatedDevice.share_id`); None otherwise."""
    status: DeviceStatus | None = None
    """What to report about the device in the claim's ``status.devices`` (conditions, data,
    network data); written after the prepare succeeds, removed at unprepare."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and not _RENAMED_PREPARED_FIELDS.keys().isdisjoint(data):
            data = dict(data)
            for old, new in _RENAMED_PREPARED_FIELDS.items():
                if old in data:
                    if new in data:
                        raise ValueError(f"give {new} or {old}, not both")
                    _renamed("PreparedDevice", old, new, depth=2)  # through BaseModel.__init__
                    data[new] = data.pop(old)
        return data

    @property
    def cdi_device_ids(self) -> tuple[str, ...]:
        """Deprecated: :attr:`cdi_devices`."""
        _renamed("PreparedDevice", "cdi_device_ids", "cdi_devices", depth=1)
        return self.cdi_devices

    @property
    def cdi_spec(self) -> CdiSpecFile | None:
        """Deprecated: :attr:`cdi_spec_file`."""
        _renamed("PreparedDevice", "cdi_spec", "cdi_spec_file", depth=1)
        return self.cdi_spec_file
