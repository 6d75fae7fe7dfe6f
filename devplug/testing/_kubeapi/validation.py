"""The API server's rules for ResourceSlices (resource.k8s.io/v1), with its field paths and texts.

From ``pkg/apis/resource/validation`` and the limits in ``pkg/apis/resource/types.go`` (dra.md §5):
a driver name is a DNS subdomain of at most 63 bytes; a pool name at most 253 bytes of DNS
subdomains joined by ``/``; exactly one of nodeName, nodeSelector, allNodes and
perDeviceNodeSelection; at most 128 devices (64 if any has taints or consumesCounters), named by
unique DNS labels; at most 32 attributes and capacities per device; attribute values with exactly
one of int, bool, string and version; at most 16 taints per device; counter sets and counter
consumptions with a name and at least one counter. (Capacity and counter values
that are not quantities cannot be decoded at all: 400, not 422, in ``_kubeapi_strategy``.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devplug.testing._kubeapi.meta import immutable, validate_object_meta
from devplug.testing._kubeapi.names import (
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
POOL_NAME_MAX = 253
# Longest attribute or capacity name shown in a field path before it is shortened.
_MAX_KEY_SHOWN = 63 + 1 + 32
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "None"]
_NODE_SELECTOR_OPERATORS = ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"]
_ONE_OF = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
_PER_DEVICE = "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec"  # noqa: E501
_PER_DEVICE_ONE_OF = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec"  # noqa: E501


def validate_slice(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[FieldError]:
    """ValidateResourceSlice (``old`` given: ValidateResourceSliceUpdate, with the immutable fields)."""
    errors = validate_object_meta(obj.get("metadata") or {}, namespaced=False)
    spec = obj.get("spec") or {}
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
    errors += _set(devices, MAX_DEVICES, lambda d, p: _device(d, p, per_device), "spec.devices", by_name=True)
    if len(devices) > MAX_DEVICES_WITH_TAINTS_OR_COUNTERS and any(
        d.get("taints") or d.get("consumesCounters") for d in devices
    ):
        errors.append(too_many("spec.devices", len(devices), MAX_DEVICES_WITH_TAINTS_OR_COUNTERS))
    counter_sets = spec.get("sharedCounters") or []
    errors += _set(counter_sets, MAX_SHARED_COUNTERS, _counter_set, "spec.sharedCounters", by_name=False)
    # a union of the two fields: `devices` present, even as an empty list, counts as set
    if spec.get("devices") is not None and counter_sets:
        errors.append(invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
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
    if len(key) > _MAX_KEY_SHOWN:
        key = key[: _MAX_KEY_SHOWN // 2] + "..." + key[-_MAX_KEY_SHOWN // 2 :]
    return f"{path}[{key}]"


def _device(device: dict[str, Any], path: str, per_device: bool) -> list[FieldError]:
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
    for name in sorted(capacity):
        errors += qualified_attribute_name(name, f"{path}.capacity")
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
    for key in ("bindingConditions", "bindingFailureConditions"):
        conditions = device.get(key) or []
        if len(conditions) > MAX_BINDING_CONDITIONS:
            errors.append(too_many(f"{path}.{key}", len(conditions), MAX_BINDING_CONDITIONS))
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
    """validateDeviceAttribute: exactly one of int, bool, string (<= 64), version (semver, <= 64)."""
    errors: list[FieldError] = []
    present = [k for k in ("int", "bool", "string", "version") if attribute.get(k) is not None]
    string = attribute.get("string")
    if isinstance(string, str) and len(string) > MAX_ATTRIBUTE_VALUE_LENGTH:
        errors.append(too_long(f"{path}.string", MAX_ATTRIBUTE_VALUE_LENGTH))
    version = attribute.get("version")
    if isinstance(version, str):
        if not is_semver(version):
            errors.append(
                invalid(f"{path}.version", version, "must be a string compatible with semver.org spec 2.0.0")
            )
        if len(version) > MAX_ATTRIBUTE_VALUE_LENGTH:
            errors.append(too_long(f"{path}.version", MAX_ATTRIBUTE_VALUE_LENGTH))
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
