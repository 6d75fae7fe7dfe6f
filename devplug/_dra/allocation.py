"""A claim's allocation and a prepared claim's devices as typed records: pure data, no I/O.

:func:`parse_allocation` reads ``status.allocation.devices`` of a ResourceClaim (the API's
JSON, camelCase names) once, where the claim is read; the rest of the DRA runtime sees an
:class:`Allocation` of :class:`DeviceResult` and :class:`DeviceConfig` records. A
:class:`PreparedEntry` is one device of a prepared claim, as the kubelet is told it and the
checkpoint keeps it; :meth:`PreparedEntry.to_json` and :meth:`PreparedEntry.from_json` are the
checkpoint's form of it. Malformed data raises :class:`AllocationError` naming the field.

Rule: no I/O, no gRPC, no API client. The JSON is read and written here and at the edges
(``kube``, ``checkpoint``; ``servicer`` speaks protobuf), never passed around as dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from collections.abc import Mapping

Source = Literal["FromClass", "FromClaim"]
SOURCES: tuple[Source, ...] = get_args(Source)
ALLOCATION = "status.allocation.devices"


class AllocationError(ValueError):
    """Malformed allocation (or checkpoint) data: the message names the field and what is wrong."""


@dataclass(frozen=True)
class DeviceResult:
    """One entry of ``status.allocation.devices.results``: a device given to one request."""

    request: str
    """The claim's request it satisfies: ``gpu``, or ``gpu/small`` for a subrequest."""
    driver: str
    pool: str
    device: str
    """The device's name in its ResourceSlice."""
    admin_access: bool = False
    """Allocated for administrative access: other claims may use the device too."""
    share_id: str | None = None
    """The share of a device that allows several allocations."""
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    """Capacity taken from a shared device, by capacity name (quantities as the API writes them)."""
    tolerations: tuple[Mapping[str, Any], ...] = ()
    """The device taints this allocation tolerates (the API's objects)."""
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceConfig:
    """One entry of ``status.allocation.devices.config``."""

    source: Source
    requests: tuple[str, ...] = ()
    """The requests it applies to; empty: every request of the claim."""
    driver: str | None = None
    """The driver of its opaque configuration; None: not an opaque configuration."""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    """The opaque parameters (any JSON object)."""


@dataclass(frozen=True)
class Allocation:
    """``status.allocation.devices`` of an allocated claim."""

    results: tuple[DeviceResult, ...] = ()
    configs: tuple[DeviceConfig, ...] = ()

    def results_of(self, driver: str) -> list[DeviceResult]:
        """The devices of ``driver``, in the allocation's order (another driver prepares its own)."""
        return [r for r in self.results if r.driver == driver]

    def configs_of(self, driver: str) -> list[DeviceConfig]:
        """The opaque configurations for ``driver`` in order of precedence: class configs first,
        claim configs after, each in listed order (a later entry overrides an earlier one)."""
        mine = [c for c in self.configs if c.driver == driver]
        return [c for c in mine if c.source == "FromClass"] + [c for c in mine if c.source != "FromClass"]


@dataclass(frozen=True)
class PreparedEntry:
    """One device of a prepared claim: the kubelet's answer for it (NodePrepareResources'
    ``Device``), kept in the checkpoint."""

    device: str
    pool: str
    requests: tuple[str, ...] = ()
    """The claim's requests it serves."""
    cdi_device_ids: tuple[str, ...] = ()
    """Fully qualified CDI device names the runtime applies to the containers that use it."""
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    """What the share consumes of the device (the checkpoint's record, weighed against the
    device's capacity when another share is prepared)."""
    status: Mapping[str, Any] | None = None
    """What the driver reports about the device in the claim's ``status.devices`` (its
    ``conditions``, ``data``, ``networkData`` in the API's shape), None for nothing."""

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's form: the kubelet's field names in the API's spelling."""
        data: dict[str, Any] = {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIds": list(self.cdi_device_ids),
            "adminAccess": self.admin_access,
        }
        if self.share_id:
            data["shareID"] = self.share_id
        if self.consumed_capacity:
            data["consumedCapacity"] = dict(self.consumed_capacity)
        if self.status is not None:
            data["status"] = dict(self.status)
        return data

    @classmethod
    def from_json(cls, data: object, where: str = "device") -> PreparedEntry:
        """Read :meth:`to_json`'s form, as every version of the checkpoint wrote it (``shareID``,
        ``consumedCapacity`` and ``status`` only when set; ``adminAccess`` taken as false when
        absent). An older version reads past the fields it does not know.

        Raises:
            AllocationError: ``data`` is not such an object; ``where`` names it in the message.
        """
        fields = _object(data, where)
        return cls(
            device=_text(fields, "device", where),
            pool=_text(fields, "pool", where),
            requests=_texts(fields, "requests", where),
            cdi_device_ids=_texts(fields, "cdiDeviceIds", where),
            admin_access=_flag(fields, "adminAccess", where),
            share_id=_text(fields, "shareID", where, required=False) or None,
            consumed_capacity=_quantities(fields, "consumedCapacity", where),
            status=_optional_object(fields, "status", where) or None,
        )


def parse_allocation(claim: Mapping[str, Any]) -> Allocation | None:
    """``status.allocation.devices`` of ``claim`` (a ResourceClaim as the API server sent it);
    None when the claim is not allocated.

    Every result and config is read, this driver's or not. Fields the records do not name are
    left out; a field that is absent or null takes its default.

    Raises:
        AllocationError: a field is missing or not of its type (the message names it).
    """
    status = _optional_object(_object(claim, "the claim"), "status", "the claim")
    allocation = status.get("allocation")
    if not allocation:
        return None
    devices = _optional_object(_object(allocation, "status.allocation"), "devices", "status.allocation")
    return Allocation(
        results=tuple(
            _result(item, f"{ALLOCATION}.results[{i}]")
            for i, item in enumerate(_list(devices, "results", ALLOCATION))
        ),
        configs=tuple(
            _config(item, f"{ALLOCATION}.config[{i}]")
            for i, item in enumerate(_list(devices, "config", ALLOCATION))
        ),
    )


def _result(data: object, where: str) -> DeviceResult:
    fields = _object(data, where)
    return DeviceResult(
        request=_text(fields, "request", where),
        driver=_text(fields, "driver", where),
        pool=_text(fields, "pool", where),
        device=_text(fields, "device", where),
        admin_access=_flag(fields, "adminAccess", where),
        share_id=_text(fields, "shareID", where, required=False) or None,
        consumed_capacity=_quantities(fields, "consumedCapacity", where),
        tolerations=tuple(
            dict(_object(t, f"{where}.tolerations[{i}]"))
            for i, t in enumerate(_list(fields, "tolerations", where))
        ),
        binding_conditions=_texts(fields, "bindingConditions", where),
        binding_failure_conditions=_texts(fields, "bindingFailureConditions", where),
    )


def _config(data: object, where: str) -> DeviceConfig:
    fields = _object(data, where)
    source: Source = fields.get("source") or "FromClaim"  # the API requires it; a claim's own by default
    if source not in SOURCES:
        raise AllocationError(f"{where}.source is {_shown(source)}, not FromClass or FromClaim")
    opaque = fields.get("opaque")
    if opaque is None:
        return DeviceConfig(source=source, requests=_texts(fields, "requests", where))
    opaque = _object(opaque, f"{where}.opaque")
    return DeviceConfig(
        source=source,
        requests=_texts(fields, "requests", where),
        driver=_text(opaque, "driver", f"{where}.opaque"),
        parameters=dict(_optional_object(opaque, "parameters", f"{where}.opaque")),
    )


# -- fields ----------------------------------------------------------------------------------------


def _object(data: object, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise AllocationError(f"{where} is not an object: {_shown(data)}")
    return data


def _optional_object(fields: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = fields.get(key)
    return {} if value is None else _object(value, f"{where}.{key}")


def _list(fields: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = fields.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise AllocationError(f"{where}.{key} is not a list: {_shown(value)}")
    return value


def _text(fields: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = fields.get(key)
    if value is None or value == "":
        if required:
            raise AllocationError(f"{where} has no {key}")
        return ""
    if not isinstance(value, str):
        raise AllocationError(f"{where}.{key} is not a string: {_shown(value)}")
    return value


def _texts(fields: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = _list(fields, key, where)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise AllocationError(f"{where}.{key}[{i}] is not a string: {_shown(value)}")
    return tuple(values)


def _flag(fields: Mapping[str, Any], key: str, where: str) -> bool:
    value = fields.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise AllocationError(f"{where}.{key} is not true or false: {_shown(value)}")
    return value


def _quantities(fields: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    values = _optional_object(fields, key, where)
    for name, value in values.items():
        if not isinstance(value, str):
            raise AllocationError(f"{where}.{key}.{name} is not a quantity string: {_shown(value)}")
    return dict(values)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
