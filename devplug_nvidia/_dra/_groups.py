"""NVIDIA's opaque configs applied to a claim: which config serves which device, NVIDIA's
``Normalize`` and ``Validate``, and the MPS pinned-memory limits.

As ``prepareDevices`` of NVIDIA's DRA driver v0.4.1: configs in precedence order (built-in
defaults, class, claim; a later one wins); per allocation result, scanning from the highest
precedence, a config naming the result's request wins (a device of another type is an error),
else the first config without requests whose kind suits the device's type; the results of one
config form one group. An empty ``timeSlicingConfig: {}`` means the ``Default`` interval (NVIDIA
dereferences a nil pointer there).

Pure: dictionaries and models in, groups and checked models out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from devplug_nvidia._config._feature_gates import MPS_SUPPORT, TIME_SLICING_SETTINGS
from devplug_nvidia._dra._config import (
    INTERVALS,
    MPS,
    TIME_SLICING,
    GpuConfig,
    GpuSharing,
    MigDeviceConfig,
    MigDeviceSharing,
    MpsConfig,
    OpaqueConfigError,
    OtherKind,
    TimeSlicingConfig,
    VfioDeviceConfig,
    decode_config,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug.models import AllocatedDevice, OpaqueConfig
    from devplug_nvidia._dra._config import Config

__all__ = ["Entry", "Group", "group_results", "opaque_configs", "pinned_limits", "prepared_config"]


# -- which config applies to which result --------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A config in precedence order, with the requests it names (empty: any)."""

    requests: tuple[str, ...]
    config: Config


def opaque_configs(
    driver: str, resource_claim: Mapping[str, Any] | None, given: Sequence[OpaqueConfig]
) -> list[Entry]:
    """The claim's configs for ``driver``, class before claim, each decoded, after the built-in
    defaults (a default ``MigDeviceConfig`` and ``GpuConfig`` without sharing).

    Read from the claim's ``status.allocation.devices.config`` as NVIDIA reads it (so that a
    non-opaque entry or an unknown source is seen); ``given`` (devplug's selection) is used when
    the claim object is not at hand.

    Raises:
        OpaqueConfigError: ``error getting opaque device configs: ...``.
    """
    entries = [Entry((), MigDeviceConfig.model_validate({})), Entry((), GpuConfig.model_validate({}))]
    try:
        entries += [
            Entry(tuple(c.get("requests") or ()), decode_config(c["parameters"]))
            for c in _mine(driver, resource_claim, given)
        ]
    except OpaqueConfigError as exc:
        raise OpaqueConfigError(f"error getting opaque device configs: {exc}") from None
    return entries


def _mine(
    driver: str, resource_claim: Mapping[str, Any] | None, given: Sequence[OpaqueConfig]
) -> list[dict[str, Any]]:
    if resource_claim is None:
        return [{"requests": c.requests, "parameters": c.parameters} for c in given]
    status = resource_claim.get("status") or {}
    configs = ((status.get("allocation") or {}).get("devices") or {}).get("config") or []
    by_source: dict[str, list[dict[str, Any]]] = {"FromClass": [], "FromClaim": []}
    for config in configs:
        source = config.get("source")
        if source not in by_source:
            raise OpaqueConfigError(f"invalid config source: {source or ''}")
        by_source[source].append(config)
    out = []
    for config in by_source["FromClass"] + by_source["FromClaim"]:
        opaque = config.get("opaque")
        if opaque is None:
            # Some future kind of configuration this driver does not know.
            raise OpaqueConfigError("only opaque parameters are supported by this driver")
        if opaque.get("driver") != driver:
            continue  # another driver's: it may serve the same request
        out.append({"requests": config.get("requests"), "parameters": opaque.get("parameters")})
    return out


@dataclass
class Group:
    """The results one config applies to (prepared together: one MPS daemon per group)."""

    config: Config
    devices: list[AllocatedDevice] = field(default_factory=list)


def group_results(
    entries: Sequence[Entry], devices: Sequence[AllocatedDevice], type_of: Callable[[str], str]
) -> list[Group]:
    """Each device's config, as NVIDIA picks it: scanning from the highest precedence, the
    first config naming the device's request (which must suit its type), or else the first
    config without requests whose kind suits its type. ``type_of``: device name → ``gpu``/``mig``.

    Raises:
        OpaqueConfigError: a config naming a request is of a kind that cannot apply to a device
            allocated for it.
    """
    groups: dict[int, Group] = {}
    for device in devices:
        kind = type_of(device.name)
        for entry in reversed(entries):
            suits = kind in type(entry.config).applies_to
            if device.request in entry.requests:
                if not suits:
                    raise OpaqueConfigError(
                        f'cannot apply {entry.config.kind} to device "{device.name}" of type "{kind}" '
                        f"(request: {device.request})"
                    )
                break
            if not entry.requests and suits:
                break
        else:  # pragma: no cover - the built-in defaults match every GPU and MIG device
            raise OpaqueConfigError(f"no config applies to device {device.name!r}")
        groups.setdefault(id(entry), Group(entry.config)).devices.append(device)
    return list(groups.values())


# -- Normalize and Validate ----------------------------------------------------------------------


def prepared_config(config: Config, gates: Mapping[str, bool]) -> Config:
    """``config`` with NVIDIA's implied defaults, once checked.

    Raises:
        OpaqueConfigError: ``error validating GPU config: ...`` (also for MIG configs, as NVIDIA
            words it), or ``runtime object is not a recognized configuration``.
    """
    if isinstance(config, OtherKind):
        raise OpaqueConfigError("runtime object is not a recognized configuration")
    if isinstance(config, VfioDeviceConfig):
        return config
    sharing = config.sharing
    if sharing is None:
        return config
    time_slicing = gates.get(TIME_SLICING_SETTINGS, False)
    mps = gates.get(MPS_SUPPORT, False)
    update: dict[str, Any] = {}
    if isinstance(sharing, GpuSharing) and time_slicing and sharing.strategy == TIME_SLICING:
        # NVIDIA fills only a missing block; an empty one crashes it. Both mean Default here.
        interval = sharing.time_slicing_config.interval if sharing.time_slicing_config else None
        update["time_slicing_config"] = TimeSlicingConfig(interval=interval or "Default")
    if mps and sharing.strategy == MPS and sharing.mps_config is None:
        update["mps_config"] = MpsConfig.model_validate({})
    if update:
        sharing = sharing.model_copy(update=update)
        config = config.model_copy(update={"sharing": sharing})
    try:
        _validate_sharing(sharing, time_slicing=time_slicing, mps=mps)
    except OpaqueConfigError as exc:
        raise OpaqueConfigError(f"error validating GPU config: {exc}") from None
    return config


def _validate_sharing(sharing: GpuSharing | MigDeviceSharing, *, time_slicing: bool, mps: bool) -> None:
    strategy = sharing.strategy
    if strategy not in (TIME_SLICING, MPS):
        raise OpaqueConfigError(
            f"unknown GPU sharing strategy: {strategy}, "
            f"supported GPU sharing strategies: {TIME_SLICING}, {MPS}"
        )
    gate = TIME_SLICING_SETTINGS if strategy == TIME_SLICING else MPS_SUPPORT
    if not (time_slicing if strategy == TIME_SLICING else mps):
        raise OpaqueConfigError(
            f'"{strategy}" is selected as the GPU sharing strategy, '
            f'but the "{gate}" feature gate is not enabled'
        )
    if strategy == TIME_SLICING and isinstance(sharing, GpuSharing):
        interval = sharing.time_slicing_config.interval if sharing.time_slicing_config else None
        if interval not in INTERVALS:
            raise OpaqueConfigError(
                f"unknown time-slice interval: {interval}, supported time-slice intervals: "
                + ", ".join(INTERVALS)
            )
    if strategy == MPS and sharing.mps_config is not None:
        percentage = sharing.mps_config.default_active_thread_percentage
        if percentage is not None and percentage < 0:
            raise OpaqueConfigError("active thread percentage must not be negative")
        if percentage is not None and percentage > 100:
            raise OpaqueConfigError("active thread percentage must not be greater than 100")


# -- MPS limits ----------------------------------------------------------------------------------


def pinned_limits(config: MpsConfig, uuids: Sequence[str]) -> dict[str, str]:
    """UUID → ``<MiB>M`` for ``set_default_device_pinned_mem_limit``: the default limit for every
    device of the group, then the per-device ones (keyed by UUID or by index into ``uuids``,
    the group's sorted UUIDs).

    Raises:
        OpaqueConfigError: a limit under 1 MiB, or a key that names no device of the group.
    """
    limits: dict[str, str] = {}
    default = config.default_pinned_device_memory_limit
    if default is not None and uuids:
        text, valid = default.megabytes()
        if not valid:
            raise OpaqueConfigError(f"invalid limit: default value set too low: {default.text}")
        limits = dict.fromkeys(uuids, text)
    for key, limit in config.default_per_device_pinned_memory_limit.items():
        uuid = _device_key(key, uuids)
        text, valid = limit.megabytes()
        if not valid:
            raise OpaqueConfigError(f"invalid limit: value set too low: {key}: {limit.text}")
        limits[uuid] = text
    return limits


def _device_key(key: str, uuids: Sequence[str]) -> str:
    if key in uuids:
        return key
    if not re.fullmatch(r"[+-]?[0-9]+", key):
        raise OpaqueConfigError(f"invalid device: unable to parse key as an integer: {key}")
    index = int(key)
    if 0 <= index < len(uuids):
        return uuids[index]
    raise OpaqueConfigError(f"invalid device: invalid device index: {index}")
