"""The kinds' write strategies, as the API server's registry applies them around storage.

Decoding (the schema, apiVersion and kind, quantities: 400), what create and update keep or
reset (server-owned metadata, the status behind its subresource, the generation, fields a
default server drops) and which validation runs (422).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from devplug._quantity import is_quantity
from devplug.testing._kubeapi.meta import validate_claim_status, validate_claim_update, validate_object_meta
from devplug.testing._kubeapi.names import QUANTITY_ERROR
from devplug.testing._kubeapi.schema import decode
from devplug.testing._kubeapi.status import FieldError, bad_request, cannot_decode, invalid_object
from devplug.testing._kubeapi.validation import validate_slice

if TYPE_CHECKING:
    from devplug.testing._kubeapi.resources import Kind

# Alpha list-valued attributes (DRAListTypeAttributes, 1.36): off by default, so dropped.
LIST_ATTRIBUTE_FIELDS = ("bools", "ints", "strings", "versions")
# What the DRAPartitionableDevices gate governs (alpha, off by default before 1.36), in the
# spec and in each device.
PARTITIONABLE_SPEC_FIELDS = ("sharedCounters", "perDeviceNodeSelection")
PARTITIONABLE_DEVICE_FIELDS = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")


def decode_body(kind: Kind, body: Any, *, strict: bool) -> list[str]:
    """Decode as the API server does (400 when it cannot); the warnings for the unknown fields dropped."""
    if not isinstance(body, dict):
        raise cannot_decode(
            kind.names, "json: cannot unmarshal non-object into Go value of type " + kind.names.kind
        )
    api_version, kind_name = body.get("apiVersion"), body.get("kind")
    if api_version not in (None, "", kind.api_version):
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({kind.api_version})"
        )
    if kind_name not in (None, "", kind.names.kind):
        raise bad_request(
            f"the kind in the data ({kind_name}) does not match the expected kind ({kind.names.kind})"
        )
    decoded = decode(kind.plural, body)
    if decoded.type_error:
        raise cannot_decode(kind.names, decoded.type_error)
    unknown = [f'unknown field "{path}"' for path in decoded.unknown]
    if unknown and strict:
        raise cannot_decode(kind.names, "strict decoding error: " + ", ".join(unknown))
    if kind.plural == "resourceslices" and (errors := decode_errors(body)):
        raise cannot_decode(kind.names, errors[0])
    body["apiVersion"], body["kind"] = kind.api_version, kind.names.kind
    body.setdefault("metadata", {})
    return unknown


def validate(kind: Kind, new: dict[str, Any], old: dict[str, Any] | None, subresource: str) -> None:
    """The kind's validation for a create (``old`` None) or an update; 422 with every error."""
    errors: list[FieldError]
    if kind.plural == "resourceslices":
        errors = validate_slice(new, old)
    elif subresource == "status" and kind.plural == "resourceclaims" and old is not None:
        errors = validate_claim_status(new, old)
    else:
        errors = validate_object_meta(new["metadata"], namespaced=kind.namespaced)
        if kind.plural == "resourceclaims" and old is not None:
            errors += validate_claim_update(new, old)
    if errors:
        raise invalid_object(kind.names, new["metadata"].get("name", ""), errors)


def prepare_create(
    kind: Kind, body: dict[str, Any], *, device_taints: bool, partitionable_devices: bool = True
) -> None:
    """PrepareForCreate: a new claim has no status; a slice loses the fields a default server drops."""
    if kind.plural == "resourceclaims":
        body.pop("status", None)
    if kind.plural == "resourceslices":
        drop_disabled_fields(body, device_taints=device_taints, partitionable_devices=partitionable_devices)


def prepare_update(
    kind: Kind,
    new: dict[str, Any],
    old: dict[str, Any],
    subresource: str,
    *,
    device_taints: bool,
    partitionable_devices: bool = True,
) -> dict[str, Any]:
    """PrepareForUpdate: what an update keeps from the stored object, and the generation."""
    meta, old_meta = new["metadata"], old["metadata"]
    if subresource == "status":
        # Status writes change nothing but the status (ResetObjectMetaForStatus).
        new = {**old, "status": new.get("status")}
        if new["status"] is None:
            del new["status"]
        new["metadata"] = copy.deepcopy(old_meta)
        return new
    for kept in ("uid", "creationTimestamp", "deletionTimestamp", "generation", "namespace"):
        if kept in old_meta:
            meta[kept] = old_meta[kept]
        else:
            meta.pop(kept, None)
    meta["resourceVersion"] = old_meta["resourceVersion"]
    if kind.status:  # the main resource cannot change the status
        new.pop("status", None)
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
    # The generation follows the spec as sent, before the disabled fields are dropped (as the
    # registry does): re-sending a dropped field counts as a change.
    if kind.tracks_generation and new.get("spec") != old.get("spec"):
        meta["generation"] = old_meta.get("generation", 0) + 1
    if kind.plural == "resourceslices":
        drop_disabled_fields(
            new, old, device_taints=device_taints, partitionable_devices=partitionable_devices
        )
    return new


def decode_errors(obj: dict[str, Any]) -> list[str]:
    """What keeps a slice from being decoded: capacity and counter values that are not quantities."""
    spec = obj.get("spec") or {}
    values: list[Any] = []
    for device in spec.get("devices") or []:
        values += [c.get("value") for c in (device.get("capacity") or {}).values() if isinstance(c, dict)]
        for consumption in device.get("consumesCounters") or []:
            values += [
                c.get("value") for c in (consumption.get("counters") or {}).values() if isinstance(c, dict)
            ]
    for counter_set in spec.get("sharedCounters") or []:
        values += [
            c.get("value") for c in (counter_set.get("counters") or {}).values() if isinstance(c, dict)
        ]
    return [QUANTITY_ERROR for v in values if v is not None and not is_quantity(v)][:1]


def drop_disabled_fields(
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    device_taints: bool,
    partitionable_devices: bool = True,
) -> None:
    """Remove what a default API server drops on write: list attributes; taints without
    DRADeviceTaints; without DRAPartitionableDevices, ``sharedCounters``,
    ``perDeviceNodeSelection`` and the devices' ``consumesCounters``, ``nodeName``,
    ``nodeSelector`` and ``allNodes``, unless the stored object ``old`` (an update) already
    uses one of them."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    drop_partitionable = not partitionable_devices and not partitionable_in_use(old)
    if drop_partitionable:
        for key in PARTITIONABLE_SPEC_FIELDS:
            spec.pop(key, None)
    for device in spec.get("devices") or []:
        if not isinstance(device, dict):
            continue
        if not device_taints:
            device.pop("taints", None)
        if drop_partitionable:
            for key in PARTITIONABLE_DEVICE_FIELDS:
                device.pop(key, None)
        for attribute in (device.get("attributes") or {}).values():
            if isinstance(attribute, dict):
                for key in LIST_ATTRIBUTE_FIELDS:
                    attribute.pop(key, None)


def partitionable_in_use(obj: dict[str, Any] | None) -> bool:
    """Whether a stored slice uses a DRAPartitionableDevices field (an update then keeps them all)."""
    spec = (obj or {}).get("spec") or {}
    if spec.get("sharedCounters") or spec.get("perDeviceNodeSelection") is not None:
        return True
    return any(
        d.get("consumesCounters") or any(d.get(k) is not None for k in PARTITIONABLE_DEVICE_FIELDS[1:])
        for d in spec.get("devices") or []
        if isinstance(d, dict)
    )
