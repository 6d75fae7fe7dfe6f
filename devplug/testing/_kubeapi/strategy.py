"""The kinds' write strategies, as the API server's registry applies them around storage.

Decoding (the schema, apiVersion and kind, quantities: 400), what create and update keep or
reset (server-owned metadata, the status behind its subresource, the generation, fields a
default server drops) and which validation runs (422).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devplug._quantity import is_quantity
from devplug.testing._kubeapi.meta import validate_claim_status, validate_claim_update, validate_object_meta
from devplug.testing._kubeapi.names import QUANTITY_ERROR
from devplug.testing._kubeapi.schema import decode
from devplug.testing._kubeapi.status import FieldError, bad_request, cannot_decode, invalid_object
from devplug.testing._kubeapi.validation import validate_slice

if TYPE_CHECKING:
    from devplug.testing._kubeapi.resources import Kind


@dataclass(frozen=True)
class Gates:
    """The feature gates a server's strategies follow, at Kubernetes 1.37's defaults."""

    device_taints: bool = True
    """DRADeviceTaints (GA in 1.37): device ``taints``."""
    partitionable_devices: bool = True
    """DRAPartitionableDevices (beta, on from 1.36): shared counters and their consumption."""
    consumable_capacity: bool = True
    """DRAConsumableCapacity (beta, on from 1.36): shared devices, capacity requests, shares."""
    binding_conditions: bool = True
    """DRADeviceBindingConditions (beta, on from 1.36): devices' binding conditions and
    ``bindsToNode``."""
    partitionable_devices_type: bool = False
    """DRAPartitionableDevicesType (alpha in 1.37, off): a slice's ``partitionTypeAttribute``."""
    list_type_attributes: bool = False
    """DRAListTypeAttributes (alpha in 1.36 and 1.37, off): list-valued attributes."""


# Alpha list-valued attributes (DRAListTypeAttributes, 1.36): off by default, so dropped.
LIST_ATTRIBUTE_FIELDS = ("bools", "ints", "strings", "versions")
# What the DRAPartitionableDevices gate governs (alpha, off by default before 1.36), in the
# spec and in each device.
PARTITIONABLE_SPEC_FIELDS = ("sharedCounters", "perDeviceNodeSelection")
PARTITIONABLE_DEVICE_FIELDS = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")
# What the DRADeviceBindingConditions gate governs (beta, on by default from 1.36) in a device.
BINDING_DEVICE_FIELDS = ("bindingConditions", "bindingFailureConditions", "bindsToNode")
# What the DRAConsumableCapacity gate governs (beta, on by default from 1.36): a device's
# ``allowMultipleAllocations`` and its capacities' ``requestPolicy``; a claim's capacity requests
# and ``distinctAttribute`` constraints; an allocation result's ``shareID`` and ``consumedCapacity``
# and a device status's ``shareID``.
CONSUMABLE_RESULT_FIELDS = ("shareID", "consumedCapacity")


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
    if kind.plural == "resourceclaims" and (errors := claim_decode_errors(body)):
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


def prepare_create(kind: Kind, body: dict[str, Any], gates: Gates = Gates()) -> None:
    """PrepareForCreate: a new claim has no status; a slice or a claim loses the fields a server
    with those gates drops."""
    if kind.plural == "resourceclaims":
        body.pop("status", None)
        drop_disabled_claim_fields(body, gates=gates)
    if kind.plural == "resourceslices":
        drop_disabled_fields(body, gates=gates)


def prepare_update(
    kind: Kind,
    new: dict[str, Any],
    old: dict[str, Any],
    subresource: str,
    gates: Gates = Gates(),
) -> dict[str, Any]:
    """PrepareForUpdate: what an update keeps from the stored object, and the generation."""
    meta, old_meta = new["metadata"], old["metadata"]
    if subresource == "status":
        # Status writes change nothing but the status (ResetObjectMetaForStatus).
        new = {**old, "status": new.get("status")}
        if new["status"] is None:
            del new["status"]
        new["metadata"] = copy.deepcopy(old_meta)
        if kind.plural == "resourceclaims":
            drop_disabled_claim_status_fields(new, old, gates=gates)
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
        drop_disabled_fields(new, old, gates=gates)
    if kind.plural == "resourceclaims":
        drop_disabled_claim_fields(new, old, gates=gates)
    return new


def _policy_values(capacity: dict[str, Any]) -> list[Any]:
    """The quantities of a capacity's requestPolicy."""
    policy = capacity.get("requestPolicy")
    if not isinstance(policy, dict):
        return []
    values = [policy.get("default"), *(policy.get("validValues") or [])]
    bounds = policy.get("validRange")
    if isinstance(bounds, dict):
        values += [bounds.get("min"), bounds.get("max"), bounds.get("step")]
    return values


def decode_errors(obj: dict[str, Any]) -> list[str]:
    """What keeps a slice from being decoded: capacity (requestPolicy included) and counter values
    that are not quantities."""
    spec = obj.get("spec") or {}
    values: list[Any] = []
    for device in spec.get("devices") or []:
        for c in (device.get("capacity") or {}).values():
            if isinstance(c, dict):
                values += [c.get("value"), *_policy_values(c)]
        for consumption in device.get("consumesCounters") or []:
            values += [
                c.get("value") for c in (consumption.get("counters") or {}).values() if isinstance(c, dict)
            ]
    for counter_set in spec.get("sharedCounters") or []:
        values += [
            c.get("value") for c in (counter_set.get("counters") or {}).values() if isinstance(c, dict)
        ]
    return [QUANTITY_ERROR for v in values if v is not None and not is_quantity(v)][:1]


def _claim_requests(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A claim's requests and subrequests: what may carry ``capacity``."""
    found: list[dict[str, Any]] = []
    for request in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            found.append(request["exactly"])
        found += [sub for sub in request.get("firstAvailable") or [] if isinstance(sub, dict)]
    return found


def _claim_results(obj: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, dict)]


def claim_decode_errors(obj: dict[str, Any]) -> list[str]:
    """What keeps a claim from being decoded: capacity requests and consumed capacities that are
    not quantities."""
    values: list[Any] = []
    for request in _claim_requests(obj):
        values += list(((request.get("capacity") or {}).get("requests") or {}).values())
    for result in _claim_results(obj):
        values += list((result.get("consumedCapacity") or {}).values())
    return [QUANTITY_ERROR for v in values if v is not None and not is_quantity(v)][:1]


def drop_disabled_fields(
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    gates: Gates = Gates(),
) -> None:
    """Remove what a server with ``gates`` drops on write: list attributes; taints without
    DRADeviceTaints; without DRAPartitionableDevices, ``sharedCounters``,
    ``perDeviceNodeSelection`` and the devices' ``consumesCounters``, ``nodeName``,
    ``nodeSelector`` and ``allNodes``, unless the stored object ``old`` (an update) already
    uses one of them; without DRAConsumableCapacity, the devices' ``allowMultipleAllocations``
    and their capacities' ``requestPolicy``, unless ``old`` uses one of those; without
    DRADeviceBindingConditions, the devices' binding conditions and ``bindsToNode`` (same
    exception); without DRAPartitionableDevicesType, ``partitionTypeAttribute`` (same)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    old_spec = (old or {}).get("spec") or {}
    if not gates.partitionable_devices_type and not old_spec.get("partitionTypeAttribute"):
        spec.pop("partitionTypeAttribute", None)
    drop_partitionable = not gates.partitionable_devices and not partitionable_in_use(old)
    if drop_partitionable:
        for key in PARTITIONABLE_SPEC_FIELDS:
            spec.pop(key, None)
    dropped: list[str] = []
    if not gates.device_taints:
        dropped.append("taints")
    if drop_partitionable:
        dropped += PARTITIONABLE_DEVICE_FIELDS
    if not gates.binding_conditions and not _binding_in_use(old):
        dropped += BINDING_DEVICE_FIELDS
    drop_consumable = not gates.consumable_capacity and not consumable_capacity_in_use(old)
    drop_lists = not gates.list_type_attributes and not _lists_in_use(old)
    for device in spec.get("devices") or []:
        if isinstance(device, dict):
            _drop_from_device(device, dropped, consumable=drop_consumable, lists=drop_lists)


def _drop_from_device(device: dict[str, Any], dropped: list[str], *, consumable: bool, lists: bool) -> None:
    """Drop ``dropped`` fields, the consumable-capacity ones if ``consumable``, list values if
    ``lists`` (the attribute stays, empty: validation then refuses it, as the API server does)."""
    for key in dropped:
        device.pop(key, None)
    if consumable:
        _drop_consumable(device)
    if lists:
        for attribute in (device.get("attributes") or {}).values():
            if isinstance(attribute, dict):
                for key in LIST_ATTRIBUTE_FIELDS:
                    attribute.pop(key, None)


def _lists_in_use(obj: dict[str, Any] | None) -> bool:
    """Whether a stored slice has a list-valued attribute."""
    devices = ((obj or {}).get("spec") or {}).get("devices") or []
    return any(
        isinstance(a, dict) and any(a.get(k) is not None for k in LIST_ATTRIBUTE_FIELDS)
        for d in devices
        if isinstance(d, dict)
        for a in (d.get("attributes") or {}).values()
    )


def _drop_consumable(device: dict[str, Any]) -> None:
    device.pop("allowMultipleAllocations", None)
    for capacity in (device.get("capacity") or {}).values():
        if isinstance(capacity, dict):
            capacity.pop("requestPolicy", None)


def _binding_in_use(obj: dict[str, Any] | None) -> bool:
    """Whether a stored slice has a device with binding conditions or ``bindsToNode``."""
    devices = ((obj or {}).get("spec") or {}).get("devices") or []
    return any(isinstance(d, dict) and any(d.get(k) for k in BINDING_DEVICE_FIELDS) for d in devices)


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


def consumable_capacity_in_use(obj: dict[str, Any] | None) -> bool:
    """Whether a stored slice sets ``allowMultipleAllocations`` (even false) or a ``requestPolicy``."""
    devices = ((obj or {}).get("spec") or {}).get("devices") or []
    return any(
        d.get("allowMultipleAllocations") is not None
        or any(
            isinstance(c, dict) and c.get("requestPolicy") is not None
            for c in (d.get("capacity") or {}).values()
        )
        for d in devices
        if isinstance(d, dict)
    )


def claim_consumable_capacity_in_use(claim: dict[str, Any] | None) -> bool:
    """Whether a stored claim uses a DRAConsumableCapacity field: capacity requests or a
    ``distinctAttribute`` in its spec, a ``shareID`` or ``consumedCapacity`` in its results, a
    ``shareID`` in its device statuses."""
    if claim is None:
        return False
    devices = (claim.get("spec") or {}).get("devices") or {}
    if any(
        isinstance(c, dict) and c.get("distinctAttribute") is not None
        for c in devices.get("constraints") or []
    ):
        return True
    if any(r.get("capacity") is not None for r in _claim_requests(claim)):
        return True
    if any(r.get(k) is not None for r in _claim_results(claim) for k in CONSUMABLE_RESULT_FIELDS):
        return True
    statuses = (claim.get("status") or {}).get("devices") or []
    return any(isinstance(d, dict) and d.get("shareID") is not None for d in statuses)


def drop_disabled_claim_fields(
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    gates: Gates = Gates(),
) -> None:
    """What a claim's spec loses on a create or an update without DRAConsumableCapacity (unless
    the stored claim ``old`` uses a field of the gate): the requests' and subrequests'
    ``capacity`` and the constraints' ``distinctAttribute``."""
    if gates.consumable_capacity or claim_consumable_capacity_in_use(old):
        return
    for request in _claim_requests(obj):
        request.pop("capacity", None)
    devices = (obj.get("spec") or {}).get("devices") or {}
    for constraint in devices.get("constraints") or []:
        if isinstance(constraint, dict):
            constraint.pop("distinctAttribute", None)


def drop_disabled_claim_status_fields(
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    gates: Gates = Gates(),
) -> None:
    """What a claim's status write loses without DRAConsumableCapacity (unless the stored claim
    ``old`` uses a field of the gate): the results' ``shareID`` and ``consumedCapacity``, the
    device statuses' ``shareID``."""
    if gates.consumable_capacity or claim_consumable_capacity_in_use(old):
        return
    for result in _claim_results(obj):
        for key in CONSUMABLE_RESULT_FIELDS:
            result.pop(key, None)
    for status in (obj.get("status") or {}).get("devices") or []:
        if isinstance(status, dict):
            status.pop("shareID", None)
