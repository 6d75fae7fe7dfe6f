"""MIG strategies: records → resource name → records (none, single, mixed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

import structlog

from devplug.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from devplug_nvidia._gpu._model import GpuRecord

__all__ = [
    "GPU_RESOURCE",
    "MigStrategy",
    "MigStrategyError",
    "apply_mig_strategy",
    "apply_naming",
    "check_sharing",
    "mig_resource_name",
]

log = structlog.get_logger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MigStrategy = Literal["none", "single", "mixed"]


class MigStrategyError(ConfigError):
    """The MIG strategy does not fit the machine (single: no MIG devices on a MIG GPU, several
    profiles, or MIG and non-MIG GPUs mixed)."""


def mig_resource_name(profile: str) -> str:
    """The mixed-strategy resource of a profile: ``1g.5gb+me`` → ``nvidia.com/mig-1g.5gb.me``."""
    return f"nvidia.com/mig-{profile.replace('+', '.')}"


def apply_mig_strategy(records: list[GpuRecord], strategy: MigStrategy) -> dict[str, list[GpuRecord]]:
    """Group discovered records into resources under a MIG strategy; empty resources are left out.

    ``none``: every full GPU is ``nvidia.com/gpu`` (MIG devices ignored). ``single``: MIG-enabled
    GPUs are replaced by their MIG devices, all ``nvidia.com/gpu``. ``mixed``: non-MIG GPUs stay
    ``nvidia.com/gpu``, each MIG device is ``nvidia.com/mig-<profile>``.

    Raises:
        MigStrategyError: the single strategy's conditions do not hold (the message says which).
        ValueError: an unknown strategy.
    """
    gpus = [r for r in records if r.kind == "gpu"]
    migs = [r for r in records if r.kind == "mig" and r.mig is not None]
    by_parent: dict[str, list[GpuRecord]] = {}
    for record in migs:
        assert record.mig is not None
        by_parent.setdefault(record.mig.parent_uuid, []).append(record)
    empty = [g for g in gpus if g.mig_enabled and not by_parent.get(g.uuid)]
    if strategy == "none":
        if any(g.mig_enabled for g in gpus):
            log.warning(
                "mig_enabled_gpus_advertised_whole",
                strategy="none",
                gpus=[g.index for g in gpus if g.mig_enabled],
            )
        return _without_empty({GPU_RESOURCE: gpus})
    if strategy == "single":
        return _single(gpus, migs, empty)
    if strategy == "mixed":
        for gpu in empty:
            log.warning("mig_enabled_without_devices", strategy="mixed", gpu=gpu.index, uuid=gpu.uuid)
        resources: dict[str, list[GpuRecord]] = {GPU_RESOURCE: [g for g in gpus if not g.mig_enabled]}
        for record in migs:
            assert record.mig is not None
            resources.setdefault(mig_resource_name(record.mig.profile), []).append(record)
        return _without_empty(resources)
    raise ValueError(f"unknown MIG strategy {strategy!r} (none, single or mixed)")


def _single(
    gpus: list[GpuRecord], migs: list[GpuRecord], empty: list[GpuRecord]
) -> dict[str, list[GpuRecord]]:
    mig_gpus = [g for g in gpus if g.mig_enabled]
    if not mig_gpus:
        log.warning("no_mig_gpus", strategy="single", fallback="none")
        return _without_empty({GPU_RESOURCE: gpus})
    if empty:
        listed = ", ".join(f"GPU {g.index} ({g.uuid})" for g in empty)
        raise MigStrategyError(
            f"mig-strategy single: MIG is enabled on {listed} but no MIG devices are configured on it; "
            "create MIG instances (nvidia-smi mig -cgi ... -C, or the MIG manager) or disable MIG there"
        )
    plain = [g for g in gpus if not g.mig_enabled]
    if plain:
        listed = ", ".join(f"GPU {g.index}" for g in plain)
        raise MigStrategyError(
            f"mig-strategy single: invalid combination of MIG and non-MIG GPUs ({listed} without MIG); "
            "enable MIG on every GPU or use mig-strategy mixed"
        )
    profiles = sorted({r.mig.profile for r in migs if r.mig is not None})
    if len(profiles) > 1:
        raise MigStrategyError(
            f"mig-strategy single: more than one MIG profile on the node ({', '.join(profiles)}); "
            "use one profile everywhere or mig-strategy mixed"
        )
    return _without_empty({GPU_RESOURCE: migs})


def check_sharing(resources: dict[str, list[GpuRecord]], sharing: str) -> None:
    """Sharing rules that only the discovered devices can decide: MPS cannot share MIG devices,
    and with the single strategy those are advertised as ``nvidia.com/gpu``, so the config file
    alone does not show it.

    Raises:
        MigStrategyError: MPS is configured and MIG devices are advertised.
    """
    if sharing != "mps":
        return
    migs = [(name, r) for name, rs in resources.items() for r in rs if r.kind == "mig"]
    if migs:
        name, record = migs[0]
        raise MigStrategyError(
            f"MPS sharing (sharing.mps) is not supported for MIG devices, but {name} is served by "
            f"{len(migs)} MIG device(s) (e.g. {record.index}, {record.uuid}); use time-slicing, "
            "disable MIG, or use mig-strategy none"
        )


def _without_empty(resources: dict[str, list[GpuRecord]]) -> dict[str, list[GpuRecord]]:
    return {name: records for name, records in resources.items() if records}


class _Pattern(Protocol):
    name: str

    def matches(self, text: str) -> bool: ...


class _Naming(Protocol):
    @property
    def gpus(self) -> Sequence[_Pattern]: ...
    @property
    def mig(self) -> Sequence[_Pattern]: ...


def apply_naming(resources: dict[str, list[GpuRecord]], naming: _Naming | None) -> dict[str, list[GpuRecord]]:
    """Rename resources by the config file's ``resources.gpus`` / ``resources.mig`` patterns.

    Upstream parses these and then ignores them; here the first pattern matching a full GPU's
    product name (``resources.gpus``) or a MIG device's profile (``resources.mig``, mixed
    strategy) names its resource. Devices that match no pattern keep the strategy's name.
    """
    if naming is None or not (naming.gpus or naming.mig):
        return resources
    renamed: dict[str, list[GpuRecord]] = {}
    for name, records in resources.items():
        for record in records:
            target = name
            if record.kind == "gpu":
                target = _first_match(naming.gpus, record.name, name)
            elif record.mig is not None and name.startswith("nvidia.com/mig-"):
                target = _first_match(naming.mig, record.mig.profile, name)
            renamed.setdefault(target, []).append(record)
    if renamed.keys() != resources.keys():
        log.info("resources_named", resources={k: len(v) for k, v in sorted(renamed.items())})
    return renamed


def _first_match(patterns: Sequence[_Pattern], text: str, default: str) -> str:
    return next((p.name for p in patterns if p.matches(text)), default)
