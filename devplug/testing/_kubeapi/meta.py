"""Validation of object metadata and of ResourceClaim updates, as the API server does it.

Rules and texts from ``k8s.io/apimachinery/pkg/api/validation`` (ObjectMeta, owner references,
labels, annotations) and ``pkg/apis/resource/validation`` (claim status).
"""

from __future__ import annotations

import re
from typing import Any

from devplug.testing._kubeapi.names import is_dns1123_subdomain, is_label_value, is_qualified_name
from devplug.testing._kubeapi.status import FieldError, forbidden, invalid, required, too_long, too_many

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
    allocated = {(r.get("driver"), r.get("pool"), r.get("device")) for r in results}
    seen: set[tuple[Any, ...]] = set()
    for i, device in enumerate(status.get("devices") or []):
        key = (device.get("driver"), device.get("pool"), device.get("device"))
        shown = "/".join(str(k) for k in key)
        if key not in allocated:
            errors.append(invalid(f"status.devices[{i}]", shown, "must be an allocated device in the claim"))
        full = (*key, device.get("shareID"))
        if full in seen:
            errors.append(FieldError("Duplicate", f"status.devices[{i}]", shown))
        seen.add(full)
    return errors
