"""The API server's rules for ResourceSlices (resource.k8s.io/v1), with its field paths and texts.

From ``pkg/apis/resource/validation`` and the limits in ``pkg/apis/resource/types.go`` (dra.md §5):
a driver name is a DNS subdomain of at most 63 bytes; a pool name at most 253 bytes of DNS
subdomains joined by ``/``; exactly one of nodeName, nodeSelector, allNodes and
perDeviceNodeSelection; at most 128 devices (64 if any has taints or consumesCounters), named by
unique DNS labels; at most 32 attributes and capacities per device; attribute values with exactly
one of int, bool, string and version; at most 16 taints per device; counter sets and counter
consumptions with a name and at least one counter. (Capacity and counter values
that are not quantities cannot be decoded at all: 400, not 422, in ``_kubeapi_strategy``.)

Consumable capacity (DRAConsumableCapacity, beta in 1.37): a capacity's ``requestPolicy`` is
Forbidden unless the device has ``allowMultipleAllocations: true``; then it may have
``validValues`` (at most 10, ascending, none above the capacity, no two the same, ``default``
required and among them) or ``validRange`` (``min`` required and not above the capacity;
``default`` required, not below ``min`` nor above ``max``; ``max`` not below ``min`` nor above
the capacity; ``step`` above zero, ``min`` + ``step`` not above the capacity, and ``default`` and
``max`` a whole number of steps from ``min``), not both. An update does not check a device's
capacities again when they are what the stored device of that name has. The integer arithmetic
is the one a default 1.37 server uses: DRAFractionalCapacityRange is on only with
``--min-compatibility-version`` 1.37, so by default values are compared as ``Value()`` (rounded
up to integers, between 0 and the int64 maximum); ``fractional_capacity_range=True`` checks as a
server with that gate does (milli-units when a value has a fraction).
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Context, Decimal, localcontext
from typing import TYPE_CHECKING, Any

from devplug.testing._kubeapi.meta import immutable, validate_object_meta
from devplug.testing._kubeapi.names import (
    INT64_MAX,
    Quantity,
    dns_label,
    dns_subdomain,
    driver_name,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
    is_semver,
    qualified_attribute_name,
)
from devplug.testing._kubeapi.status import (
    FieldError,
    duplicate,
    forbidden,
    invalid,
    not_supported,
    required,
    too_long,
    too_many,
)

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_TAINTS = 16
MAX_SHARED_COUNTERS = 8
MAX_COUNTERS = 32
MAX_CONSUMES_COUNTERS = 2
MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
POOL_NAME_MAX = 253
# Longest attribute or capacity name shown in a field path before it is shortened.
_MAX_KEY_SHOWN = 63 + 1 + 32
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "None"]
_NODE_SELECTOR_OPERATORS = ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"]
_ONE_OF = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
_PER_DEVICE = "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec"  # noqa: E501
_PER_DEVICE_ONE_OF = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec"  # noqa: E501


def validate_slice(
    obj: dict[str, Any], old: dict[str, Any] | None = None, *, fractional_capacity_range: bool = False
) -> list[FieldError]:
    """ValidateResourceSlice (``old`` given: ValidateResourceSliceUpdate, with the immutable fields).

    ``fractional_capacity_range``: the DRAFractionalCapacityRange gate (off in a default 1.37).
    """
    errors = validate_object_meta(obj.get("metadata") or {}, namespaced=False)
    spec = obj.get("spec") or {}
    old_devices = {
        d.get("name"): d for d in ((old or {}).get("spec") or {}).get("devices") or [] if isinstance(d, dict)
    }
    errors += driver_name(spec.get("driver") or "", "spec.driver")
    errors += _pool(spec.get("pool") or {})
    if old is not None:
        old_spec = old.get("spec") or {}
        errors += immutable(
            "spec.pool.name", (spec.get("pool") or {}).get("name"), (old_spec.get("pool") or {}).get("name")
        )
        errors += immutable("spec.driver", spec.get("driver"), old_spec.get("driver"))
        errors += immutable("spec.nodeName", spec.get("nodeName") or None, old_spec.get("nodeName") or None)
    errors += _node_selection(spec)
    devices = spec.get("devices") or []
    per_device = bool(spec.get("perDeviceNodeSelection"))
    errors += _set(
        devices,
        MAX_DEVICES,
        lambda d, p: _device(
            d, p, per_device, old_devices.get(d.get("name")), fractional=fractional_capacity_range
        ),
        "spec.devices",
        by_name=True,
    )
    if len(devices) > MAX_DEVICES_WITH_TAINTS_OR_COUNTERS and any(
        d.get("taints") or d.get("consumesCounters") for d in devices
    ):
        errors.append(too_many("spec.devices", len(devices), MAX_DEVICES_WITH_TAINTS_OR_COUNTERS))
    counter_sets = spec.get("sharedCounters") or []
    errors += _set(counter_sets, MAX_SHARED_COUNTERS, _counter_set, "spec.sharedCounters", by_name=False)
    # a union of the two fields: `devices` present, even as an empty list, counts as set
    if spec.get("devices") is not None and counter_sets:
        errors.append(invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    if spec.get("partitionTypeAttribute") is not None:
        errors += _partition_type(spec)
    return errors


def _partition_type(spec: dict[str, Any]) -> list[FieldError]:
    """validatePartitionTypeAttribute (1.37): a fully qualified name, on a slice whose devices
    consume counters, each of which carries it (or its bare name in the driver's domain) as a
    string."""
    path = "spec.partitionTypeAttribute"
    name = str(spec["partitionTypeAttribute"])
    devices = [d for d in spec.get("devices") or [] if isinstance(d, dict)]
    if not any(d.get("consumesCounters") for d in devices):
        return [
            invalid(path, name, "may only be set on a slice which declares devices that consume counters")
        ]
    errors = qualified_attribute_name(name, path)
    if "/" not in name:
        errors.append(
            invalid(path, name, "a fully qualified name must be a domain and a name separated by a slash")
        )
    if errors:
        return errors  # no device can carry a malformed name: that one error says it
    bare = name.removeprefix(f"{spec.get('driver')}/")
    for i, device in enumerate(devices):
        if not device.get("consumesCounters"):
            continue
        attributes = device.get("attributes") or {}
        at = f"spec.devices[{i}].attributes[{name}]"
        attribute = attributes.get(name, attributes.get(bare))
        if attribute is None:
            errors.append(
                required(
                    at,
                    "device consumes counters and `partitionTypeAttribute` names this attribute, "
                    "so it must be set",
                )
            )
        elif not isinstance(attribute, dict) or "string" not in attribute:
            errors.append(
                invalid(
                    at,
                    attribute,
                    "must be a string value because `partitionTypeAttribute` names this attribute",
                )
            )
    return errors


def _binding_conditions(device: dict[str, Any], path: str) -> list[FieldError]:
    """validateDeviceBindingParameters: at most 4 of each, label-key names, none twice, the two
    lists apart, and each list only with the other."""
    errors: list[FieldError] = []
    conditions = device.get("bindingConditions") or []
    failures = device.get("bindingFailureConditions") or []
    for key, names in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(names) > MAX_BINDING_CONDITIONS:
            errors.append(too_many(f"{path}.{key}", len(names), MAX_BINDING_CONDITIONS))
        seen: set[str] = set()
        for i, name in enumerate(names):
            at = f"{path}.{key}[{i}]"
            errors += [invalid(at, name, m) for m in is_qualified_name(str(name))]
            if name in seen:
                errors.append(duplicate(at, name))
            seen.add(name)
            if key == "bindingFailureConditions" and name in conditions:
                errors.append(
                    invalid(at, name, "bindingFailureConditions must not overlap with bindingConditions")
                )
    if failures and not conditions:
        errors.append(
            invalid(
                f"{path}.bindingConditions",
                conditions,
                "bindingConditions are required to use bindingFailureConditions",
            )
        )
    if conditions and not failures:
        errors.append(
            invalid(
                f"{path}.bindingFailureConditions",
                failures,
                "bindingFailureConditions are required to use bindingConditions",
            )
        )
    return errors


def _pool(pool: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    name = pool.get("name") or ""
    if not name:
        errors.append(required("spec.pool.name"))
    else:
        if len(name) > POOL_NAME_MAX:
            errors.append(too_long("spec.pool.name", POOL_NAME_MAX))
        for part in name.split("/"):
            errors += [invalid("spec.pool.name", part, m) for m in is_dns1123_subdomain(part)]
    generation = pool.get("generation") or 0
    if generation < 0:
        errors.append(invalid("spec.pool.generation", generation, "must be greater than or equal to zero"))
    count = pool.get("resourceSliceCount") or 0
    if count <= 0:
        errors.append(invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    return errors


def _node_selection(spec: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    chosen: list[str] = []
    if spec.get("nodeName"):
        chosen.append("`nodeName`")
        errors += dns_subdomain(spec["nodeName"], "spec.nodeName")
    if spec.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        errors += _node_selector(spec["nodeSelector"], "spec.nodeSelector")
    if spec.get("allNodes"):
        chosen.append("`allNodes`")
    if spec.get("perDeviceNodeSelection"):
        chosen.append("`perDeviceNodeSelection`")
    if not chosen:
        errors.append(required("spec", _ONE_OF))
    elif len(chosen) > 1:
        errors.append(
            invalid("spec", "{" + ", ".join(chosen) + "}", _ONE_OF + ", but multiple fields are set")
        )
    return errors


def _node_selector(selector: dict[str, Any], path: str) -> list[FieldError]:
    terms = selector.get("nodeSelectorTerms") or []
    errors: list[FieldError] = []
    if len(terms) != 1:
        errors.append(invalid(f"{path}.nodeSelectorTerms", terms, "must have exactly one node selector term"))
    for i, term in enumerate(terms):
        for kind in ("matchExpressions", "matchFields"):
            for j, expr in enumerate(term.get(kind) or []):
                at = f"{path}.nodeSelectorTerms[{i}].{kind}[{j}]"
                key = expr.get("key") or ""
                errors += [invalid(f"{at}.key", key, m) for m in is_qualified_name(key)]
                operator = expr.get("operator") or ""
                if operator not in _NODE_SELECTOR_OPERATORS:
                    errors.append(not_supported(f"{at}.operator", operator, _NODE_SELECTOR_OPERATORS))
    return errors


def _set(
    items: list[Any],
    limit: int,
    check: Callable[[dict[str, Any], str], list[FieldError]],
    path: str,
    *,
    by_name: bool,
) -> list[FieldError]:
    """validateSet: each item checked, names unique, then the count. A duplicate is shown by its
    name (devices) or as the whole item (counter sets), as the API server shows them."""
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        errors += check(item, f"{path}[{i}]")
        name = item.get("name") or ""
        if name in seen:
            errors.append(duplicate(f"{path}[{i}]", name if by_name else item))
        seen.add(name)
    if len(items) > limit:
        errors.append(too_many(path, len(items), limit))
    return errors


def _key_path(path: str, key: str) -> str:
    """A map entry's path, a long key cut in the middle as truncateIfTooLong cuts it."""
    if len(key) > _MAX_KEY_SHOWN:
        kept = _MAX_KEY_SHOWN - 3
        key = key[: (kept + 1) // 2] + "..." + key[len(key) - kept // 2 :]
    return f"{path}[{key}]"


def _device(
    device: dict[str, Any],
    path: str,
    per_device: bool,
    old_device: dict[str, Any] | None = None,
    *,
    fractional: bool = False,
) -> list[FieldError]:
    errors = dns_label(device.get("name") or "", f"{path}.name")
    attributes: dict[str, Any] = device.get("attributes") or {}
    capacity: dict[str, Any] = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            invalid(
                path,
                len(attributes) + len(capacity),
                f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}",  # noqa: E501
            )
        )
    # a key's errors are the map's (validateMap checks keys at the map's path), a value's its own
    for name in sorted(attributes):
        errors += qualified_attribute_name(name, f"{path}.attributes")
        errors += _attribute(attributes[name] or {}, _key_path(f"{path}.attributes", name))
    old_capacity = None if old_device is None else old_device.get("capacity") or {}
    # An update leaves capacities that did not change unchecked, their names too.
    if old_capacity is None or not _same_capacities(capacity, old_capacity):
        multiple = device.get("allowMultipleAllocations") is True
        errors += _capacities(capacity, f"{path}.capacity", multiple=multiple, fractional=fractional)
    consumes = device.get("consumesCounters") or []
    for i, consumption in enumerate(consumes):
        at = f"{path}.consumesCounters[{i}]"
        errors += _counter_set_name(consumption.get("counterSet") or "", f"{at}.counterSet")
        errors += _counters(consumption.get("counters") or {}, f"{at}.counters")
    if len(consumes) > MAX_CONSUMES_COUNTERS:
        errors.append(too_many(f"{path}.consumesCounters", len(consumes), MAX_CONSUMES_COUNTERS))
    taints = device.get("taints") or []
    for i, taint in enumerate(taints):
        errors += _taint(taint, f"{path}.taints[{i}]")
    if len(taints) > MAX_TAINTS:
        errors.append(too_many(f"{path}.taints", len(taints), MAX_TAINTS))
    errors += _binding_conditions(device, path)
    node_fields = [k for k in ("nodeName", "nodeSelector", "allNodes") if device.get(k)]
    if per_device and len(node_fields) != 1:
        errors.append(
            required(path, _PER_DEVICE_ONE_OF)
            if not node_fields
            else invalid(path, node_fields, _PER_DEVICE_ONE_OF)
        )
    elif not per_device and node_fields:
        errors.append(invalid(path, node_fields, _PER_DEVICE))
    return errors


# the value fields an attribute may have, as 1.37 names them (the list ones whatever the gate says)
_ATTRIBUTE_TYPES = "`int`, `bool`, `string`, `version`, `ints`, `bools`, `strings`, `versions`"


def _attribute(attribute: dict[str, Any], path: str) -> list[FieldError]:
    """validateDeviceAttribute: exactly one of int, bool, string (<= 64), version (semver, <= 64),
    or (DRAListTypeAttributes) a non-empty list of one of them: ints, bools, strings, versions."""
    errors: list[FieldError] = []
    kinds = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
    present = [k for k in kinds if attribute.get(k) is not None]
    strings = [(f"{path}.string", attribute.get("string"))]
    strings += [(f"{path}.strings[{i}]", v) for i, v in enumerate(attribute.get("strings") or [])]
    for at, string in strings:
        if isinstance(string, str) and len(string) > MAX_ATTRIBUTE_VALUE_LENGTH:
            errors.append(too_long(at, MAX_ATTRIBUTE_VALUE_LENGTH))
    versions = [(f"{path}.version", attribute.get("version"))]
    versions += [(f"{path}.versions[{i}]", v) for i, v in enumerate(attribute.get("versions") or [])]
    for at, version in versions:
        if isinstance(version, str):
            if not is_semver(version):
                errors.append(invalid(at, version, "must be a string compatible with semver.org spec 2.0.0"))
            if len(version) > MAX_ATTRIBUTE_VALUE_LENGTH:
                errors.append(too_long(at, MAX_ATTRIBUTE_VALUE_LENGTH))
    for key in ("ints", "bools", "strings", "versions"):
        if attribute.get(key) == []:
            errors.append(invalid(f"{path}.{key}", [], "must not be empty if specified"))
    if not present:
        errors.append(invalid(path, "", f"must specify one of: {_ATTRIBUTE_TYPES}"))
    elif len(present) > 1:
        shown = "{" + ", ".join(present) + "}"
        errors.append(invalid(path, shown, f"must specify exactly one of: {_ATTRIBUTE_TYPES}"))
    return errors


def _taint(taint: dict[str, Any], path: str) -> list[FieldError]:
    key = taint.get("key") or ""
    errors = [invalid(f"{path}.key", key, m) for m in is_qualified_name(key)]
    value = taint.get("value") or ""
    if value:
        errors += [invalid(f"{path}.value", value, m) for m in is_label_value(value)]
    effect = taint.get("effect") or ""
    if not effect:
        errors.append(required(f"{path}.effect"))
    elif effect not in TAINT_EFFECTS:
        errors.append(not_supported(f"{path}.effect", effect, TAINT_EFFECTS))
    return errors


def _counter_set_name(name: str, path: str) -> list[FieldError]:
    return [required(path)] if not name else dns_label(name, path)


def _counters(counters: dict[str, Any], path: str) -> list[FieldError]:
    """A counter set's counters, or a device's consumption of one: required (an empty map is
    ``Required value``, the error NVIDIA's DynamicMIG hit for GPUs without MIG, #1092), at most
    32, named by DNS labels."""
    if not counters:
        return [required(path)]
    errors: list[FieldError] = []
    if len(counters) > MAX_COUNTERS:
        errors.append(too_many(path, len(counters), MAX_COUNTERS))
    for name in sorted(counters):  # a key's errors are the map's
        errors += dns_label(name, path)
    return errors


def _counter_set(counter_set: dict[str, Any], path: str) -> list[FieldError]:
    return _counter_set_name(counter_set.get("name") or "", f"{path}.name") + _counters(
        counter_set.get("counters") or {}, f"{path}.counters"
    )


# -- consumable capacity ---------------------------------------------------------------------------

_ONE_POLICY = (
    'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time'
)
_NEGATIVE = "must be greater than or equal to 0"
_DEFAULT_NOT_VALID = "default value is not valid according to the requestPolicy"


def _quantity(raw: Any) -> Quantity:
    """A decoded quantity (the decoding refused any other: 400); absent is zero, as in Go."""
    return Quantity.parse("0" if raw is None else raw)


def _policy_key(policy: Any) -> Any:
    if not isinstance(policy, dict):
        return None
    values = [_quantity(v).value for v in policy.get("validValues") or []]
    bounds = policy.get("validRange")
    if isinstance(bounds, dict):
        bounds = tuple(
            None if bounds.get(k) is None else _quantity(bounds[k]).value for k in ("min", "max", "step")
        )
    default = policy.get("default")
    return (None if default is None else _quantity(default).value, values, bounds)


def _same_capacities(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """apiequality.Semantic.DeepEqual of two capacity maps: quantities by value, empty == absent."""
    if set(new) != set(old):
        return False
    for name, value in new.items():
        entry, before = value or {}, old[name] or {}
        if _quantity(entry.get("value")).value != _quantity(before.get("value")).value:
            return False
        if _policy_key(entry.get("requestPolicy")) != _policy_key(before.get("requestPolicy")):
            return False
    return True


def _capacities(capacity: dict[str, Any], path: str, *, multiple: bool, fractional: bool) -> list[FieldError]:
    """A device's capacity map: the names, and each requestPolicy (Forbidden on a device that is
    not allowed multiple allocations)."""
    errors: list[FieldError] = []
    for name in sorted(capacity):  # a key's errors are the map's, a value's its own
        errors += qualified_attribute_name(name, path)
        entry = capacity[name] or {}
        policy = entry.get("requestPolicy")
        if policy is None:
            continue
        at = _key_path(path, name) + ".requestPolicy"
        if not multiple:
            errors.append(forbidden(at, "allowMultipleAllocations must be true"))
        else:
            errors += _request_policy(_quantity(entry.get("value")), policy, at, fractional=fractional)
    return errors


def _request_policy(
    capacity: Quantity, policy: dict[str, Any], path: str, *, fractional: bool
) -> list[FieldError]:
    """validateRequestPolicy: validValues or validRange, not both, each with its default."""
    values = policy.get("validValues") or []
    bounds = policy.get("validRange")
    default = policy.get("default")
    if values and bounds is not None:
        return [forbidden(path, _ONE_POLICY)]
    if values:
        if default is None:
            return [required(f"{path}.default", "required when validValues is defined")]
        return _valid_values(_quantity(default), capacity, values, f"{path}.validValues", fractional)
    if bounds is not None:
        if default is None:
            return [required(f"{path}.default", "required when validRange is defined")]
        return _valid_range(_quantity(default), capacity, bounds, f"{path}.validRange", fractional)
    return []


def _valid_values(
    default: Quantity, capacity: Quantity, raw_values: list[Any], path: str, fractional: bool
) -> list[FieldError]:
    """validateRequestPolicyValidValues. Over 10 values, the values themselves are not looked at
    (so the default is not found among them either), as upstream's validateSet stops there."""
    values = [_quantity(v) for v in raw_values]
    errors = [
        invalid(f"{path}[{i + 1}]", str(values[i + 1]), "values must be sorted in ascending order")
        for i in range(len(values) - 1)
        if values[i].value > values[i + 1].value
    ]
    found = False
    if len(values) > MAX_VALID_VALUES:
        errors.append(too_many(path, len(values), MAX_VALID_VALUES))
    else:
        for i, option in enumerate(values):
            if option.value > capacity.value:
                errors.append(
                    invalid(f"{path}[{i}]", str(option), f"option is larger than capacity value: {capacity}")
                )
            found = found or option.value == default.value
        # Duplicates by the key upstream uses: Value() (integers) without the fractional gate,
        # the decimal value with it.
        seen: set[str] = set()
        for i, option in enumerate(values):
            key = _decimal_key(raw_values[i]) if fractional else str(option.int_value())
            if key in seen:
                errors.append(duplicate(f"{path}[{i}]", key))
            seen.add(key)
    if not found:
        errors.append(invalid(path, str(default), _DEFAULT_NOT_VALID))
    return errors


_BINARY_EXPONENTS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def _decimal_key(raw: Any) -> str:
    """quantityKeyAsDec: the decimal text of the value as ``ParseQuantity`` holds it, trailing
    zeros and all (``500m`` is ``0.500``, ``0.5`` is ``0.5``: two keys); a value it cannot hold
    in an int64 mantissa is rounded to nanos (nine decimals)."""
    text = raw if isinstance(raw, str) else str(raw)
    match = re.fullmatch(r"([+-]?)0*([0-9]*)(?:\.([0-9]*))?(.*)", text)
    if match is None:  # not a quantity: the decoding refused it already
        return text
    sign, num, denom, suffix = match[1], match[2] or "0", match[3] or "", match[4]
    if suffix in _BINARY_EXPONENTS:
        exponent = _BINARY_EXPONENTS[suffix]
        mantissa = 1 << exponent
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1 if not denom else -1
        scale = 0
    else:
        exponent = _DECIMAL_EXPONENTS[suffix] if suffix in _DECIMAL_EXPONENTS else int(suffix[1:])
        mantissa, precision, scale = 1, 18 - len(num) - len(denom), exponent - len(denom)
    whole = int(num + denom) * mantissa
    if precision >= 0 and scale >= -9 and whole <= INT64_MAX:
        return format(Decimal(f"{sign}{whole}").scaleb(scale), "f")
    value = Quantity.parse(raw).value
    if value == 0:
        return format(value, "f")
    with localcontext(Context(prec=200)):
        return format(value.quantize(Decimal("1e-9"), rounding=ROUND_UP), "f")


def _valid_range(
    default: Quantity, capacity: Quantity, bounds: dict[str, Any], path: str, fractional: bool
) -> list[FieldError]:
    """validateRequestPolicyRange (the default's errors are at ``validRange.default``, as upstream
    has them)."""
    if bounds.get("min") is None:
        return [required(f"{path}.min", "required when validRange is defined")]
    low = _quantity(bounds["min"])
    high = None if bounds.get("max") is None else _quantity(bounds["max"])
    step = None if bounds.get("step") is None else _quantity(bounds["step"])
    errors: list[FieldError] = []
    if low.value > capacity.value:
        errors.append(invalid(f"{path}.min", str(low), f"min is larger than capacity value: {capacity}"))
    if default.value < low.value:
        errors.append(invalid(f"{path}.default", str(default), f"default is less than min: {low}"))
    if high is not None:
        if low.value > high.value:
            errors.append(invalid(f"{path}.max", str(low), f"min is larger than max: {high}"))
        if high.value > capacity.value:
            errors.append(invalid(f"{path}.max", str(high), f"max is larger than capacity value: {capacity}"))
        if default.value > high.value:
            errors.append(invalid(f"{path}.default", str(default), f"default is more than max: {high}"))
    named = {"default": default, "min": low, "max": high, "step": step}
    milli = fractional and any(q is not None and q.is_fractional() for q in named.values())
    if milli:
        lossy = [
            invalid(f"{path}.{name}", str(q), "value cannot be represented as a milli value")
            for name, q in named.items()
            if q is not None and not q.milli_exact()
        ]
        if lossy:
            return errors + lossy
    if step is not None:
        errors += _range_step(low, step, named, capacity, path, milli=milli)
    return errors


def _range_step(
    low: Quantity,
    step: Quantity,
    named: dict[str, Quantity | None],
    capacity: Quantity,
    path: str,
    *,
    milli: bool,
) -> list[FieldError]:
    """The step's rules: above zero, one step from min within the capacity, default and max on a step."""
    if step.value <= 0:
        return [invalid(f"{path}.step", str(step), "must be greater than zero")]
    errors: list[FieldError] = []
    added = Quantity(low.value + step.value, step.format if low.value == 0 else low.format)
    if added.value > capacity.value:
        errors.append(
            invalid(f"{path}.step", str(step), f"one step {added} is larger than capacity value: {capacity}")
        )
    if not milli:
        # Value() holds only between 0 and the int64 maximum: outside, no step arithmetic.
        unsafe = [
            invalid(
                f"{path}.{name}",
                str(q),
                _NEGATIVE if q.value < 0 else f"must not be larger than {INT64_MAX}",
            )
            for name, q in named.items()
            if q is not None and not 0 <= q.value <= INT64_MAX
        ]
        if unsafe:
            return errors + unsafe
    for name in ("default", "max"):
        value = named[name]
        if value is not None:
            errors += _on_step(value, low, step, f"{path}.step", milli=milli)
    return errors


def _on_step(value: Quantity, low: Quantity, step: Quantity, path: str, *, milli: bool) -> list[FieldError]:
    """validateRequestPolicyRangeStep: ``value`` is a whole number of steps above ``low``."""
    if milli:
        offset, size = value.milli_value() - low.milli_value(), step.milli_value()
    else:
        offset, size = value.int_value() - low.int_value(), step.int_value()
    if abs(offset) % size == 0:  # Go's remainder keeps the dividend's sign: only zero matters
        return []
    return [invalid(path, str(value), f"value is not a multiple of a given step ({step}) from ({low})")]
