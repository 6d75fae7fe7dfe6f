"""The NVIDIA config file (``--config-file``, version v1): strict models and the file reader.

The same camelCase keys as NVIDIA's device plugin. Every mapping forbids unknown keys, and an
unknown key is reported with the place it belongs when it is a known key elsewhere (the usual
mistake: ``renameByDefault`` under ``flags`` instead of ``sharing.timeSlicing``). Pure parsing:
the only I/O is :func:`read_config_file`.
"""

from __future__ import annotations

import difflib
import re
import uuid
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from devplug.errors import ConfigError
from devplug.settings import keys_at, read_yaml

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "ConfigFileV1",
    "FileFlags",
    "GfdFlags",
    "HealthConfig",
    "ImexConfig",
    "NamedResource",
    "PluginFlags",
    "ReplicaResource",
    "Resources",
    "Sharing",
    "SharingSection",
    "read_config_file",
]

DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]

_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_GPU_INDEX = re.compile(r"^[0-9]+$")
_MIG_INDEX = re.compile(r"^[0-9]+:[0-9]+$")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def is_gpu_uuid(ref: str) -> bool:
    """``GPU-<uuid>``."""
    return ref.startswith("GPU-") and _is_uuid(ref[4:])


def is_mig_uuid(ref: str) -> bool:
    """``MIG-<uuid>`` or the older ``MIG-GPU-<uuid>/<gi>/<ci>``."""
    if not ref.startswith("MIG-"):
        return False
    rest = ref[4:]
    if _is_uuid(rest):
        return True
    parts = rest.split("/")
    return len(parts) == 3 and is_gpu_uuid(parts[0]) and all(p.isdigit() for p in parts[1:])


def is_mig_ref(ref: str) -> bool:
    """A device reference that names a MIG device (``i:j`` or a MIG UUID)."""
    return bool(_MIG_INDEX.match(ref)) or is_mig_uuid(ref)


def resource_name(value: object) -> str:
    """Upstream's resource-name rule: ``name`` or ``nvidia.com/name``; returns the full name."""
    if not isinstance(value, str):
        raise ValueError(f"a resource name is a string, got {value!r}")
    prefix, sep, name = value.rpartition("/")
    if sep and prefix != "nvidia.com":
        raise ValueError(f"resource name {value!r}: only the nvidia.com/ prefix is allowed")
    if not _RESOURCE_NAME.match(name):
        raise ValueError(
            f"resource name {value!r}: letters, digits, '-', '_' and '.', starting and ending "
            "with a letter or digit, at most 63 characters"
        )
    return f"nvidia.com/{name}"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class PluginFlags(_Strict):
    """``flags.plugin``."""

    pass_device_specs: bool | None = Field(default=None, alias="passDeviceSpecs")
    device_list_strategy: tuple[DeviceListStrategy, ...] | None = Field(
        default=None, alias="deviceListStrategy"
    )
    device_id_strategy: Literal["uuid", "index"] | None = Field(default=None, alias="deviceIDStrategy")
    cdi_annotation_prefix: str | None = Field(default=None, alias="cdiAnnotationPrefix")
    nvidia_ctk_path: str | None = Field(default=None, alias="nvidiaCTKPath")
    container_driver_root: str | None = Field(default=None, alias="containerDriverRoot")
    kubelet_socket: str | None = Field(default=None, alias="kubeletSocket")
    cdi_feature_flags: tuple[str, ...] | None = Field(default=None, alias="cdiFeatureFlags")
    shared_devices_allocation_policy: Literal["distributed", "packed"] | None = Field(
        default=None, alias="sharedDevicesAllocationPolicy"
    )

    @field_validator("device_list_strategy", "cdi_feature_flags", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        # Upstream accepts one string or a list of strings.
        return [value] if isinstance(value, str) else value


class GfdFlags(_Strict):
    """``flags.gfd``: gpu-feature-discovery's options, accepted and not used by the plugin."""

    oneshot: bool | None = None
    no_timestamp: bool | None = Field(default=None, alias="noTimestamp")
    sleep_interval: str | None = Field(default=None, alias="sleepInterval")
    output_file: str | None = Field(default=None, alias="outputFile")
    machine_type_file: str | None = Field(default=None, alias="machineTypeFile")


class FileFlags(_Strict):
    """``flags``."""

    mig_strategy: Literal["none", "single", "mixed"] | None = Field(default=None, alias="migStrategy")
    fail_on_init_error: bool | None = Field(default=None, alias="failOnInitError")
    mps_root: str | None = Field(default=None, alias="mpsRoot")
    nvidia_driver_root: str | None = Field(default=None, alias="nvidiaDriverRoot")
    nvidia_dev_root: str | None = Field(default=None, alias="nvidiaDevRoot")
    gdrcopy_enabled: bool | None = Field(default=None, alias="gdrcopyEnabled")
    gds_enabled: bool | None = Field(default=None, alias="gdsEnabled")
    mofed_enabled: bool | None = Field(default=None, alias="mofedEnabled")
    use_node_feature_api: bool | None = Field(default=None, alias="useNodeFeatureAPI")
    device_discovery_strategy: Literal["auto", "nvml", "tegra"] | None = Field(
        default=None, alias="deviceDiscoveryStrategy"
    )
    plugin: PluginFlags | None = None
    gfd: GfdFlags | None = None


class NamedResource(_Strict):
    """One ``resources.gpus`` / ``resources.mig`` entry: devices whose product (or MIG profile)
    matches ``pattern`` (``*`` matches any run of characters) are advertised as ``name``."""

    pattern: str = Field(min_length=1)
    name: str

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        return resource_name(value)

    def matches(self, text: str) -> bool:
        regex = "^" + ".*".join(re.escape(part) for part in self.pattern.split("*")) + "$"
        return re.match(regex, text) is not None


class Resources(_Strict):
    """``resources``: naming patterns for full GPUs and MIG devices."""

    gpus: tuple[NamedResource, ...] = ()
    mig: tuple[NamedResource, ...] = ()


ReplicaDevices = Literal["all"] | int | tuple[str, ...]


class ReplicaResource(_Strict):
    """One ``sharing.*.resources`` entry."""

    name: str
    rename: str | None = None
    devices: ReplicaDevices = "all"
    """``all``, a count of devices, or a list of GPU indexes, ``i:j`` MIG indexes or UUIDs."""
    replicas: int

    @field_validator("name", "rename", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str | None:
        return None if value is None else resource_name(value)

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"devices must be 'all', a count or a list, got {value!r}")
        if isinstance(value, str):
            if value != "all":
                raise ValueError(f"devices set as {value!r} but the only valid string is 'all'")
            return value
        if isinstance(value, int):
            if value <= 0:
                raise ValueError(f"devices set as {value} but a count of devices must be > 0")
            return value
        if isinstance(value, list | tuple):
            refs: list[str] = []
            for item in value:
                if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                    refs.append(str(item))
                elif isinstance(item, str) and (
                    _GPU_INDEX.match(item) or _MIG_INDEX.match(item) or is_gpu_uuid(item) or is_mig_uuid(item)
                ):
                    refs.append(item)
                else:
                    raise ValueError(
                        f"device {item!r} in the devices list is not a GPU index, an i:j MIG index, "
                        "a GPU-<uuid> or a MIG-<uuid>"
                    )
            return tuple(refs)
        raise ValueError(f"devices must be 'all', a count or a list, got {value!r}")

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int) -> int:
        if value < 2:
            raise ValueError(f"replicas must be at least 2, got {value}")
        return value


class SharingSection(_Strict):
    """``sharing.timeSlicing`` or ``sharing.mps``."""

    strategy: Literal[""] = ""
    rename_by_default: bool = Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: bool | None = Field(default=None, alias="failRequestsGreaterThanOne")
    resources: tuple[ReplicaResource, ...] = Field(min_length=1)


class Sharing(_Strict):
    """``sharing``."""

    time_slicing: SharingSection | None = Field(default=None, alias="timeSlicing")
    mps: SharingSection | None = None

    @model_validator(mode="after")
    def _exclusive(self) -> Sharing:
        if self.time_slicing is not None and self.mps is not None:
            raise ValueError("timeSlicing and mps are mutually exclusive: configure one of them")
        if self.mps is not None:
            for res in self.mps.resources:
                if res.name.removeprefix("nvidia.com/").startswith("mig-") or (
                    isinstance(res.devices, tuple) and any(is_mig_ref(d) for d in res.devices)
                ):
                    raise ValueError(f"MPS sharing is not supported for MIG devices ({res.name})")
        return self

    @property
    def strategy(self) -> Literal["none", "time-slicing", "mps"]:
        if self.mps is not None:
            return "mps"
        return "time-slicing" if self.time_slicing is not None else "none"

    @property
    def section(self) -> SharingSection | None:
        return self.mps or self.time_slicing

    @property
    def fail_requests_greater_than_one(self) -> bool:
        """Time-slicing: off unless set; MPS: on unless set."""
        section = self.section
        if section is None or section.fail_requests_greater_than_one is None:
            return self.mps is not None
        return section.fail_requests_greater_than_one


class ImexConfig(_Strict):
    """``imex``: the IMEX channels injected into every container that gets a device."""

    channel_ids: tuple[int, ...] = Field(default=(), alias="channelIDs")
    required: bool = False


EventType = Literal["EventTypeXidCriticalError", "EventTypeDoubleBitEccError", "EventTypeSingleBitEccError"]


class HealthConfig(_Strict):
    """``health`` (upstream's newer health-check section): which NVML events are watched and
    which XIDs count. Parsed and validated here; acted on by the health checker."""

    disabled: bool = False
    event_types: tuple[EventType, ...] = Field(default=(), alias="eventTypes")
    """Empty: upstream's default, all three event types."""
    ignored_xids: tuple[int, ...] = Field(default=(), alias="ignoredXIDs")
    """Empty: upstream's default application XIDs (13, 31, 43, 45, 68, 109)."""
    critical_xids: Literal["all"] | tuple[int, ...] | None = Field(default=None, alias="criticalXIDs")
    """``all`` (also the meaning of unset) or the only XIDs that make a device unhealthy."""

    @field_validator("critical_xids", mode="before")
    @classmethod
    def _all(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.lower() != "all":
                raise ValueError(f"criticalXIDs must be 'all' or a list of XIDs, got {value!r}")
            return "all"
        return value

    @field_validator("ignored_xids", "critical_xids")
    @classmethod
    def _unsigned(cls, value: Any) -> Any:
        if isinstance(value, tuple) and any(x < 0 for x in value):
            raise ValueError("XIDs are non-negative numbers")
        return value

    @model_validator(mode="after")
    def _no_conflict(self) -> HealthConfig:
        if isinstance(self.critical_xids, tuple):
            both = sorted(set(self.critical_xids) & set(self.ignored_xids))
            if both:
                raise ValueError(f"XID {both[0]} is in both ignoredXIDs and criticalXIDs")
        return self


class ConfigFileV1(_Strict):
    """The whole file."""

    version: Literal["v1"] = "v1"
    flags: FileFlags = FileFlags()
    resources: Resources | None = None
    sharing: Sharing = Sharing()
    imex: ImexConfig = ImexConfig()
    health: HealthConfig | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if value is None:
            return "v1"
        if value != "v1":
            raise ValueError(f"unknown version {value!r}: only v1 is supported")
        return value


def _places(model: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """Every key of the file, mapped to the places (dotted paths) where it is valid."""
    found: dict[str, list[str]] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        found.setdefault(key, []).append(prefix or "the top level")
        for sub, is_list in _nested_models(info.annotation):
            where = (f"{prefix}.{key}" if prefix else key) + ("[]" if is_list else "")
            for k, places in _places(sub, where).items():
                found.setdefault(k, []).extend(p for p in places if p not in found[k])
    return found


def _nested_models(annotation: Any, in_list: bool = False) -> list[tuple[type[BaseModel], bool]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, in_list)]
    out: list[tuple[type[BaseModel], bool]] = []
    is_tuple = getattr(annotation, "__origin__", None) is tuple
    for arg in getattr(annotation, "__args__", ()):
        out.extend(_nested_models(arg, in_list or is_tuple))
    return out


_KEY_PLACES = _places(ConfigFileV1)


def _dotted(loc: list[str | int], *, items: bool = False) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += "[]" if items else f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _describe(path: Path, exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = list(first["loc"])
    if first["type"] == "extra_forbidden":
        key = str(loc[-1])
        where = _dotted(loc[:-1]) or "the top level"
        text = f"config file {path}: unknown key {key!r} under {where}"
        here = _dotted(loc[:-1], items=True) or "the top level"
        places = [p for p in _KEY_PLACES.get(key, []) if p != here]
        if places:
            text += f"; {key!r} belongs under {' or '.join(places)}"
        else:
            close = difflib.get_close_matches(key, keys_at(ConfigFileV1, loc[:-1]), n=1)
            if close:
                text += f' (did you mean "{close[0]}"?)'
        return text
    message = first["msg"].removeprefix("Value error, ")
    text = f"config file {path}: invalid {_dotted(loc) or 'config'}: {message}"
    if first["type"] not in ("value_error", "missing") and "input" in first:
        text += f" (got {first['input']!r})"
    return text


def parse_config(data: Any, path: Path) -> ConfigFileV1:
    """Validate an already loaded document. Raises ConfigError (one line)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping, got {type(data).__name__}")
    try:
        return ConfigFileV1.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(path, exc)) from None


def read_config_file(path: Path) -> ConfigFileV1:
    """Read and validate a v1 config file (YAML or JSON). Raises ConfigError (one line)."""
    return parse_config(read_yaml(path), path)
