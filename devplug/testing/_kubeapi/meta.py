"""Validation of object metadata and of ResourceClaim updates, as the API server does it.

Rules and texts from ``k8s.io/apimachinery/pkg/api/validation`` (ObjectMeta, owner references,
labels, annotations) and ``pkg/apis/resource/validation`` (claim status).
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from devplug.testing._kubeapi.names import is_dns1123_subdomain, is_label_value, is_qualified_name
from devplug.testing._kubeapi.status import (
    FieldError,
    forbidden,
    invalid,
    not_supported,
    required,
    too_long,
    too_many,
)

ANNOTATIONS_MAX_BYTES = 256 * 1024
RESERVED_FOR_MAX = 256


def _mask_trailing_dash(name: str) -> str:
    # A generateName may end in "-": the suffix follows it.
    return name[:-1] + "a" if len(name) > 1 and name.endswith("-") else name


def validate_object_meta(meta: dict[str, Any], *, namespaced: bool) -> list[FieldError]:
    """ValidateObjectMeta with ``NameIsDNSSubdomain`` names (all the kinds served here use them)."""
    errors: list[FieldError] = []
    generate = meta.get("generateName") or ""
    if generate:
        errors += [
            invalid("metadata.generateName", generate, m)
            for m in is_dns1123_subdomain(_mask_trailing_dash(generate))
        ]
    name = meta.get("name") or ""
    if not name:
        errors.append(required("metadata.name", "name or generateName is required"))
    else:
        errors += [invalid("metadata.name", name, m) for m in is_dns1123_subdomain(name)]
    if namespaced and not meta.get("namespace"):
        errors.append(required("metadata.namespace"))
    errors += validate_labels(meta.get("labels") or {}, "metadata.labels")
    errors += validate_annotations(meta.get("annotations") or {}, "metadata.annotations")
    errors += validate_owner_references(meta.get("ownerReferences") or [], "metadata.ownerReferences")
    for finalizer in meta.get("finalizers") or []:  # the list's path, as the API server has it
        errors += [invalid("metadata.finalizers", finalizer, m) for m in is_qualified_name(finalizer)]
    return errors


def validate_labels(labels: dict[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for key, value in labels.items():
        errors += [invalid(path, key, m) for m in is_qualified_name(key)]
        errors += [invalid(path, value, m) for m in is_label_value(str(value))]
    return errors


def validate_annotations(annotations: dict[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    size = 0
    for key, value in annotations.items():
        errors += [invalid(path, key, m) for m in is_qualified_name(key.lower())]
        size += len(key) + len(str(value))
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(too_long(path, ANNOTATIONS_MAX_BYTES))
    return errors


def validate_owner_references(refs: list[dict[str, Any]], path: str) -> list[FieldError]:
    """ValidateOwnerReferences as 1.37 words it: indexed paths, Required for an empty field."""
    errors: list[FieldError] = []
    controller = ""
    for i, ref in enumerate(refs):
        at = f"{path}[{i}]"
        api_version = ref.get("apiVersion") or ""
        if not api_version:
            errors.append(required(f"{at}.apiVersion", "must not be empty"))
        elif not re.fullmatch(r"([^/]+/)?[^/]+", api_version):
            errors.append(invalid(f"{at}.apiVersion", api_version, "must be <group>/<version> or <version>"))
        for key in ("kind", "name", "uid"):
            if not ref.get(key):
                errors.append(required(f"{at}.{key}", "must not be empty"))
        if ref.get("controller"):
            current = f"{ref.get('kind', '')}/{ref.get('name', '')}"
            if controller:
                detail = (
                    'Only one reference can have Controller set to true. Found "true" in references for '
                    f"{controller} and {current}"
                )
                errors.append(invalid(path, refs, detail))
            else:
                controller = current
    return errors


def immutable(path: str, new: Any, old: Any) -> list[FieldError]:
    return [] if new == old else [invalid(path, new, "field is immutable")]


# -- ResourceClaim ---------------------------------------------------------------------------------


def validate_claim_update(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """A claim's spec cannot change after creation."""
    return immutable("spec", new.get("spec"), old.get("spec"))


def validate_claim_status(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """ValidateResourceClaimStatusUpdate, the parts a driver or the scheduler meets.

    The allocation is immutable once set; ``reservedFor`` needs an allocation; ``status.devices``
    may only describe allocated devices, each once.
    """
    errors: list[FieldError] = []
    status = new.get("status") or {}
    old_status = old.get("status") or {}
    allocation = status.get("allocation")
    if allocation is not None and old_status.get("allocation") is not None:
        errors += immutable("status.allocation", allocation, old_status["allocation"])
    reserved = status.get("reservedFor") or []
    if reserved and allocation is None:
        errors.append(forbidden("status.reservedFor", "may not be specified when `allocated` is not set"))
    if len(reserved) > RESERVED_FOR_MAX:
        errors.append(too_many("status.reservedFor", len(reserved), RESERVED_FOR_MAX))
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    allocated = {(r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID")) for r in results}
    seen: set[tuple[Any, ...]] = set()
    for i, device in enumerate(status.get("devices") or []):
        path = f"status.devices[{i}]"
        key = (device.get("driver"), device.get("pool"), device.get("device"), device.get("shareID"))
        shown = "/".join(str(k) for k in key if k is not None)
        if key not in allocated:
            errors.append(invalid(path, shown, "must be an allocated device in the claim"))
        if key in seen:
            errors.append(FieldError("Duplicate", path, shown))
        seen.add(key)
        errors += _device_status(device, path)
    return errors


# Claim device status (KEP-4817): at most 8 conditions, 10 KiB of data, 16 addresses.
MAX_DEVICE_CONDITIONS = 8
DEVICE_DATA_MAX_BYTES = 10 * 1024
MAX_NETWORK_IPS = 16
INTERFACE_NAME_MAX = 256
HARDWARE_ADDRESS_MAX = 128
CONDITION_REASON_MAX = 1024
CONDITION_MESSAGE_MAX = 32 * 1024
_REASON_FMT = "[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?"
_REASON_RE = re.compile(_REASON_FMT)
_REASON_MSG = (
    "a condition reason must start with alphabetic character, optionally followed by a string of "
    "alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. "
    "'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', "
    f"regex used for validation is '{_REASON_FMT}')"
)
_STATUSES = ("False", "True", "Unknown")


def _device_status(device: dict[str, Any], path: str) -> list[FieldError]:
    """validateDeviceStatus's own rules for one entry: its conditions (metav1 conditions), its
    ``data`` (a JSON object of at most 10 KiB) and its ``networkData``."""
    errors: list[FieldError] = []
    conditions = device.get("conditions") or []
    if len(conditions) > MAX_DEVICE_CONDITIONS:
        errors.append(too_many(f"{path}.conditions", len(conditions), MAX_DEVICE_CONDITIONS))
    types: set[Any] = set()
    for i, condition in enumerate(conditions):
        at = f"{path}.conditions[{i}]"
        if condition.get("type") in types:
            errors.append(FieldError("Duplicate", at, condition.get("type")))
        types.add(condition.get("type"))
        errors += _condition(condition, at)
    data = device.get("data")
    if data is not None:
        if len(json.dumps(data, separators=(",", ":"))) > DEVICE_DATA_MAX_BYTES:
            errors.append(too_long(f"{path}.data", DEVICE_DATA_MAX_BYTES))
        elif not isinstance(data, dict):
            errors.append(invalid(f"{path}.data", "<value omitted>", "must be a valid JSON object"))
    network = device.get("networkData") or {}
    if len(network.get("interfaceName") or "") > INTERFACE_NAME_MAX:
        errors.append(too_long(f"{path}.networkData.interfaceName", INTERFACE_NAME_MAX))
    if len(network.get("hardwareAddress") or "") > HARDWARE_ADDRESS_MAX:
        errors.append(too_long(f"{path}.networkData.hardwareAddress", HARDWARE_ADDRESS_MAX))
    ips = network.get("ips") or []
    if len(ips) > MAX_NETWORK_IPS:
        errors.append(too_many(f"{path}.networkData.ips", len(ips), MAX_NETWORK_IPS))
    for i, address in enumerate(ips):
        problem = _interface_address(str(address))
        if problem:
            errors.append(invalid(f"{path}.networkData.ips[{i}]", address, problem))
        if address in ips[:i]:
            errors.append(FieldError("Duplicate", f"{path}.networkData.ips[{i}]", address))
    return errors


def _condition(condition: dict[str, Any], path: str) -> list[FieldError]:
    """metav1 ValidateCondition."""
    errors: list[FieldError] = []
    kind = condition.get("type") or ""
    if not kind:
        errors.append(required(f"{path}.type", "is required"))
    else:
        errors += [invalid(f"{path}.type", kind, m) for m in is_qualified_name(kind)]
    status = condition.get("status") or ""
    if not status:
        errors.append(required(f"{path}.status"))
    elif status not in _STATUSES:
        errors.append(not_supported(f"{path}.status", status, list(_STATUSES)))
    if (condition.get("observedGeneration") or 0) < 0:
        errors.append(
            invalid(
                f"{path}.observedGeneration",
                condition["observedGeneration"],
                "must be greater than or equal to zero",
            )
        )
    if not condition.get("lastTransitionTime"):
        errors.append(required(f"{path}.lastTransitionTime"))
    reason = condition.get("reason") or ""
    if not reason:
        errors.append(required(f"{path}.reason"))
    else:
        if not _REASON_RE.fullmatch(reason):
            errors.append(invalid(f"{path}.reason", reason, _REASON_MSG))
        if len(reason) > CONDITION_REASON_MAX:
            errors.append(too_long(f"{path}.reason", CONDITION_REASON_MAX))
    if len(condition.get("message") or "") > CONDITION_MESSAGE_MAX:
        errors.append(too_long(f"{path}.message", CONDITION_MESSAGE_MAX))
    return errors


def _interface_address(value: str) -> str:
    """IsValidInterfaceAddress: an address with its prefix length, in canonical form; "" if so."""
    try:
        interface = ipaddress.ip_interface(value)
    except ValueError:
        return "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)"
    if "/" not in value:
        return "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)"
    canonical = f"{interface.ip}/{interface.network.prefixlen}"
    return "" if value == canonical else f'must be in canonical form ("{canonical}")'
