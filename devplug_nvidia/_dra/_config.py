"""NVIDIA's opaque claim configuration, ``resource.nvidia.com/v1beta1``: the kinds and their decoding.

The kinds ``GpuConfig`` and ``MigDeviceConfig`` (``sharing``: ``TimeSlicing`` or ``MPS``) and
``VfioDeviceConfig`` (decoded, never applicable here: devplug publishes no ``vfio`` devices), as
NVIDIA's DRA driver v0.4.1 reads them:

decoding is strict, with the texts of Kubernetes' JSON serializer (``strict decoding error:
unknown field "sharing.foo"``; a wrong ``kind`` or ``apiVersion``: ``no kind ... is
registered``); JSON ``null`` leaves a field unset, as Go's decoder does. Which config applies
to which device, and NVIDIA's checks, are in :mod:`devplug_nvidia._dra._groups`.

Pure: dictionaries in, pydantic models out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from devplug.errors import DevplugError

__all__ = [
    "API_VERSION",
    "GpuConfig",
    "MigDeviceConfig",
    "MpsConfig",
    "OpaqueConfigError",
    "OtherKind",
    "Quantity",
    "TimeSlicingConfig",
    "VfioDeviceConfig",
    "decode_config",
]

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
"""Time-slice interval → the ``nvidia-smi compute-policy --set-timeslice`` value."""
# The name Kubernetes' scheme gets from where NVIDIA's api.go creates it.
_SCHEME = "sigs.k8s.io/dra-driver-nvidia-gpu/api/nvidia.com/resource/v1beta1/api.go:63"
_OTHER_KINDS = frozenset(
    {"ComputeDomainChannelConfig", "ComputeDomainDaemonConfig", "ComputeDomain", "ComputeDomainClique"}
)
_QUANTITY_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_QUANTITY = re.compile(r"([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MIB = 1 << 20


class OpaqueConfigError(DevplugError):
    """A claim's opaque configuration cannot be used; the message is NVIDIA's."""


# -- quantities ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes quantity (``10Gi``, ``500M``, ``1e9``) as written, and its value."""

    text: str
    value: int
    """The value rounded up to an integer, as ``resource.Quantity.Value()``."""

    @classmethod
    def parse(cls, raw: object) -> Quantity:
        """Parse a JSON string or number as ``resource.Quantity`` does.

        Raises:
            OpaqueConfigError: not a quantity (Kubernetes' message).
        """
        text = json.dumps(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else raw
        if not isinstance(text, str) or not _QUANTITY.fullmatch(text.strip()):
            raise OpaqueConfigError(_QUANTITY_FORMAT)
        number, suffix = _QUANTITY.fullmatch(text.strip()).groups()  # type: ignore[union-attr]
        if suffix in _BINARY:
            scale = Decimal(2) ** _BINARY[suffix]
        elif suffix in _DECIMAL:
            scale = Decimal(10) ** _DECIMAL[suffix]
        elif re.fullmatch(r"[eE][-+]?[0-9]+", suffix):
            scale = Decimal(10) ** int(suffix[1:])
        else:
            raise OpaqueConfigError("unable to parse quantity's suffix")
        try:
            amount = Decimal(number) * scale
        except InvalidOperation:
            raise OpaqueConfigError("unable to parse numeric part of quantity") from None
        return cls(text, math.ceil(amount))

    def megabytes(self) -> tuple[str, bool]:
        """``<value / 2^20>M`` (Go's integer division) and whether that is at least 1 MiB."""
        mib = int(self.value / _MIB) if abs(self.value) < 2**52 else self.value // _MIB
        return f"{mib}M", mib > 0


# -- the kinds -----------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True
    )
    go_name: ClassVar[str]
    """The Go struct NVIDIA decodes into (for decoding errors)."""


class TimeSlicingConfig(_Strict):
    go_name: ClassVar[str] = "TimeSlicingConfig"
    interval: str | None = None
    """Default, Short, Medium or Long."""


class MpsConfig(_Strict):
    go_name: ClassVar[str] = "MpsConfig"
    default_active_thread_percentage: int | None = Field(None, alias="defaultActiveThreadPercentage")
    default_pinned_device_memory_limit: Quantity | None = Field(None, alias="defaultPinnedDeviceMemoryLimit")
    default_per_device_pinned_memory_limit: dict[str, Quantity] = Field(
        default_factory=dict, alias="defaultPerDevicePinnedMemoryLimit"
    )
    """Device (a UUID, or an index into the group's sorted UUIDs) → limit."""


class GpuSharing(_Strict):
    go_name: ClassVar[str] = "GpuSharing"
    strategy: str = ""
    time_slicing_config: TimeSlicingConfig | None = Field(None, alias="timeSlicingConfig")
    mps_config: MpsConfig | None = Field(None, alias="mpsConfig")


class MigDeviceSharing(_Strict):
    go_name: ClassVar[str] = "MigDeviceSharing"
    strategy: str = ""
    mps_config: MpsConfig | None = Field(None, alias="mpsConfig")


class IommuConfig(_Strict):
    go_name: ClassVar[str] = "IOMMUConfig"
    backend_policy: str = Field("", alias="backendPolicy")
    enable_api_device: bool | None = Field(None, alias="enableAPIDevice")


class _Kind(_Strict):
    applies_to: ClassVar[frozenset[str]] = frozenset()
    """The device types (``gpu``, ``mig``) a config of this kind without requests applies to."""
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str


class GpuConfig(_Kind):
    """``kind: GpuConfig``: how full GPUs are shared."""

    go_name: ClassVar[str] = "GpuConfig"
    applies_to: ClassVar[frozenset[str]] = frozenset({"gpu"})
    kind: Literal["GpuConfig"] = "GpuConfig"
    sharing: GpuSharing | None = None


class MigDeviceConfig(_Kind):
    """``kind: MigDeviceConfig``: how MIG devices are shared (no time-slicing settings)."""

    go_name: ClassVar[str] = "MigDeviceConfig"
    applies_to: ClassVar[frozenset[str]] = frozenset({"mig", "migdyn"})
    kind: Literal["MigDeviceConfig"] = "MigDeviceConfig"
    sharing: MigDeviceSharing | None = None


class VfioDeviceConfig(_Kind):
    """``kind: VfioDeviceConfig``: decoded strictly, applicable to ``vfio`` devices only."""

    go_name: ClassVar[str] = "VfioDeviceConfig"
    applies_to: ClassVar[frozenset[str]] = frozenset({"vfio"})
    kind: Literal["VfioDeviceConfig"] = "VfioDeviceConfig"
    iommu: IommuConfig | None = None


class OtherKind(_Kind):
    """A kind NVIDIA's scheme knows but the GPU driver cannot apply (the ComputeDomain ones)."""

    go_name: ClassVar[str] = "ComputeDomainConfig"
    model_config = ConfigDict(extra="allow")
    applies_to: ClassVar[frozenset[str]] = frozenset({"gpu", "mig", "migdyn", "vfio"})


Config = GpuConfig | MigDeviceConfig | VfioDeviceConfig | OtherKind
_KINDS: dict[str, type[_Kind]] = {
    "GpuConfig": GpuConfig,
    "MigDeviceConfig": MigDeviceConfig,
    "VfioDeviceConfig": VfioDeviceConfig,
}


# -- decoding ------------------------------------------------------------------------------------


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


class _Decoder:
    """Go's strict JSON decoding of one config: the first type error wins, else every unknown field."""

    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.error: str | None = None

    def fail(self, value: object, owner: type[_Strict], path: str, go_type: str) -> None:
        if self.error is None:
            shown = f"number {value}" if isinstance(value, float) else _json_type(value)
            where = f"Go struct field {owner.go_name}.{path}"
            self.error = f"json: cannot unmarshal {shown} into {where} of type {go_type}"

    def struct(self, cls: type[_Strict], data: dict[str, Any], prefix: str) -> dict[str, Any]:
        by_alias = {(info.alias or name): (name, info) for name, info in cls.model_fields.items()}
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key not in by_alias:
                self.unknown.append(f'unknown field "{prefix}{key}"')
                continue
            if value is None:
                continue  # null leaves a Go field at its zero value
            name, info = by_alias[key]
            path = f"{prefix}{key}"
            out[name] = self.value(cls, info.annotation, value, path)
        return out

    def value(self, owner: type[_Strict], annotation: Any, value: Any, path: str) -> Any:
        nested = _nested_model(annotation)
        if nested is not None:
            if isinstance(value, dict):
                return self.struct(nested, value, path + ".")
            self.fail(value, owner, path, f"v1beta1.{nested.go_name}")
        elif annotation in (Quantity, Quantity | None):
            return self.quantity(value)
        elif "dict" in str(annotation):
            if isinstance(value, dict):
                return {k: self.quantity(v) for k, v in value.items()}
            self.fail(value, owner, path, "v1beta1.MpsPerDevicePinnedMemoryLimit")
        else:
            return self.scalar(owner, annotation, value, path)
        return None

    def scalar(self, owner: type[_Strict], annotation: Any, value: Any, path: str) -> Any:
        if annotation in (int, int | None):
            if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
                self.fail(value, owner, path, "int")
                return None
            return int(value)
        if annotation in (bool, bool | None):
            if not isinstance(value, bool):
                self.fail(value, owner, path, "bool")
                return None
            return value
        if not isinstance(value, str):
            self.fail(value, owner, path, _GO_STRINGS.get(path.rsplit(".", 1)[-1], "string"))
            return None
        return value

    def quantity(self, value: Any) -> Quantity:
        if value is None:
            return Quantity("0", 0)
        try:
            return Quantity.parse(value)
        except OpaqueConfigError as exc:
            if self.error is None:
                self.error = str(exc)
            return Quantity("0", 0)


_GO_STRINGS = {
    "strategy": "v1beta1.GpuSharingStrategy",
    "interval": "v1beta1.TimeSliceInterval",
    "backendPolicy": "v1beta1.IOMMUBackendPolicy",
}


def _nested_model(annotation: Any) -> type[_Strict] | None:
    for candidate in (TimeSlicingConfig, MpsConfig, GpuSharing, MigDeviceSharing, IommuConfig):
        if annotation in (candidate, candidate | None):
            return candidate
    return None


def _group_version(api_version: str) -> tuple[str, str]:
    if api_version.count("/") > 1:
        raise OpaqueConfigError(f"unexpected GroupVersion string: {api_version}")
    group, _, version = api_version.rpartition("/")
    return group, version


def decode_config(parameters: object) -> Config:
    """One config's ``parameters`` decoded as NVIDIA's strict decoder does.

    Raises:
        OpaqueConfigError: ``error decoding config parameters: ...`` with the decoder's text.
    """
    try:
        return _decode(parameters)
    except OpaqueConfigError as exc:
        raise OpaqueConfigError(f"error decoding config parameters: {exc}") from None


def _decode(parameters: object) -> Config:
    raw = json.dumps(parameters, separators=(",", ":"))
    if not isinstance(parameters, dict):
        raise OpaqueConfigError(
            f"json: cannot unmarshal {_json_type(parameters)} into Go value of type struct "
            '{ APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }'
        )
    for key in ("apiVersion", "kind"):
        value = parameters.get(key)
        if value is not None and not isinstance(value, str):
            raise OpaqueConfigError(
                f"json: cannot unmarshal {_json_type(value)} into Go struct field .{key} of type string"
            )
    kind = parameters.get("kind") or ""
    group, version = _group_version(parameters.get("apiVersion") or "")
    if not kind:
        raise OpaqueConfigError(f"Object 'Kind' is missing in '{raw}'")
    if not version:
        raise OpaqueConfigError(f"Object 'apiVersion' is missing in '{raw}'")
    gv = f"{group}/{version}" if group else version
    if (group, version) != (GROUP, VERSION) or (kind not in _KINDS and kind not in _OTHER_KINDS):
        raise OpaqueConfigError(f'no kind "{kind}" is registered for version "{gv}" in scheme "{_SCHEME}"')
    if kind in _OTHER_KINDS:
        return OtherKind.model_validate({"kind": kind})
    cls = _KINDS[kind]
    decoder = _Decoder()
    values = decoder.struct(cls, parameters, "")
    if decoder.error is not None:
        raise OpaqueConfigError(decoder.error)
    if decoder.unknown:
        raise OpaqueConfigError("strict decoding error: " + ", ".join(decoder.unknown))
    decoded: Config = cls.model_validate(values)  # type: ignore[assignment]
    return decoded
