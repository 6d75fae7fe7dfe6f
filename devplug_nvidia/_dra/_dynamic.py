"""Dynamic MIG (NVIDIA's ``DynamicMIG`` feature gate): every MIG profile at every placement of a
MIG-enabled GPU is a device, and a claim's MIG device is created when it is prepared.

Published as NVIDIA's DRA driver v0.4.1 publishes it (nvidia-dra.md §2-3):

* one device per GPU-instance profile whose compute instance fills it (C == G) and per possible
  placement, named ``gpu-<minor>-mig-<profile>-<GI profile ID>-<placement start>``, with the
  parent's attributes, ``type: mig``, ``parentUUID`` and ``profile``, no ``uuid``; capacities
  ``multiprocessors``, ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``,
  ``ofaEngines``, ``memory``;
* per GPU a counter set ``gpu-<minor>-counter-set``: the largest value of each capacity over the
  profiles (``copy-engines``, ``jpeg-engines``... as DNS labels) and ``memory-slice-<i>`` (1) per
  memory slice; each device consumes its capacities and the memory slices of its placement;
* GPUs without MIG mode (and GPUs that are not MIG-capable) stay plain ``gpu-<minor>`` devices:
  no counters (NVIDIA's bug #1092 published invalid slices for them).

Prepare creates the GPU instance at the device's placement
(``nvmlDeviceCreateGpuInstanceWithPlacement``) and its compute instance
(``nvmlGpuInstanceCreateComputeInstance``); what was created is written to
``<plugin dir>/dynamic-mig/<claim UID>.json`` after each step, and a prepare that fails half-way
destroys it all again. Unprepare destroys the claim's instances (compute instance first), from
that file alone. MIG instances that exist when the driver starts are left as they are: a
placement they hold fails to prepare (NVML's INSUFFICIENT_RESOURCES).

With consumable shares (NVIDIA v0.5.0) a MIG device serves several claims: it is created by the
first claim that has a share of it, used as it is by the others, and destroyed when its last
claim goes (the plugin's ``release_device``); its state file is then the device's,
``<plugin dir>/dynamic-mig/device-<name>.json``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import structlog

from devplug.errors import DevplugError
from devplug.models import CounterConsumption, CounterSet, Device
from devplug_nvidia._discovery._mig import mig_cap_paths, mig_profile_name, read_mig_minors
from devplug_nvidia._dra._devices import _common, binary_quantity, mig_device_name
from devplug_nvidia._gpu import _nvml
from devplug_nvidia._gpu._model import MigInfo
from devplug_nvidia._gpu._nvml import NvmlError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from devplug.models import AllocatedDevice, Claim
    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia._gpu._nvml import Nvml
    from devplug_nvidia.discovery import NvmlSource


__all__ = [
    "DYNAMIC_MIG_GATE",
    "DynamicMig",
    "DynamicMigError",
    "MigSlot",
    "creates_mig_devices",
    "destroys_mig_devices",
    "dynamic_mig",
    "dynamic_mig_enabled",
    "shared_key",
]

log = structlog.get_logger("devplug_nvidia.dra_dynamic")

P = TypeVar("P")
U = TypeVar("U")

DYNAMIC_MIG_GATE = "DynamicMIG"
_GI_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT (profiles 0 to 17)
# Compute-instance profile (NVML_COMPUTE_INSTANCE_PROFILE_*) by slice count.
_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_CI_ENGINE_SHARED = 0x0
_CAPACITIES = (
    "multiprocessors",
    "copyEngines",
    "decoders",
    "encoders",
    "jpegEngines",
    "ofaEngines",
    "memory",
)
_COUNTER = {
    "multiprocessors": "multiprocessors",
    "copyEngines": "copy-engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg-engines",
    "ofaEngines": "ofa-engines",
    "memory": "memory",
}


class DynamicMigError(DevplugError):
    """A dynamic MIG device could not be created or destroyed (the message says which and why)."""


def dynamic_mig_enabled(settings: Any) -> bool:
    """Whether ``--feature-gates`` turns ``DynamicMIG`` on (NVIDIA's default: off)."""
    gate = getattr(settings, "gate_enabled", None)
    if gate is not None:
        return bool(gate(DYNAMIC_MIG_GATE))
    text = getattr(settings, "feature_gates", "") or ""
    for item in str(text).split(","):
        name, _, value = item.partition("=")
        if name.strip() == DYNAMIC_MIG_GATE:
            return value.strip() in ("1", "t", "T", "TRUE", "true", "True")
    return False


def counter_set_name(minor: int) -> str:
    """``gpu-<minor>-counter-set``: the counters a GPU's MIG devices share."""
    return f"gpu-{minor}-counter-set"


def memory_slice(index: int) -> str:
    """``memory-slice-<i>``: one memory slice of a GPU, as a counter."""
    return f"memory-slice-{index}"


@dataclass(frozen=True)
class MigSlot:
    """One publishable MIG device of dynamic MIG: a profile at a placement of a GPU."""

    name: str
    parent: GpuRecord
    profile: str
    """The profile name (``1g.5gb``, ``1g.5gb+me``)."""
    gi_profile: int
    """The NVML_GPU_INSTANCE_PROFILE_* index it is looked up by."""
    gi_profile_id: int
    """The ID NVML reports for it (``GpuInstanceProfileInfo.id``)."""
    ci_profile: int
    start: int
    size: int
    capacity: dict[str, int]


@dataclass(frozen=True)
class Created:
    """What a prepare made for one device (the state file's entries)."""

    device: str
    parent_uuid: str
    gpu_instance: int
    compute_instance: int | None = None
    uuid: str | None = None


class DynamicMig:
    """The dynamic MIG devices of a node, and their creation and destruction.

    Args:
        slots: every publishable MIG device (see :meth:`discover`).
        gpus: the MIG-enabled GPUs they live on (their records).
        source: where NVML comes from (the same as discovery's).
        state_dir: where what a claim created is kept (``<plugin dir>/dynamic-mig``).
    """

    def __init__(
        self, slots: Sequence[MigSlot], gpus: Sequence[GpuRecord], source: NvmlSource, state_dir: Path
    ) -> None:
        self.slots = {s.name: s for s in slots}
        self.gpus = {g.uuid: g for g in gpus}
        self.source = source
        self.state_dir = state_dir
        self.devices = self._devices(slots)

    @classmethod
    def discover(
        cls, nvml: Nvml, records: Iterable[GpuRecord], source: NvmlSource, state_dir: Path
    ) -> DynamicMig:
        """The profiles and placements of every MIG-enabled GPU among ``records`` (read with
        ``details=True``). GPUs without MIG mode get none.

        Raises:
            NvmlError: NVML failed otherwise than "not supported" for a profile.
        """
        slots: list[MigSlot] = []
        gpus: list[GpuRecord] = []
        for record in records:
            if record.kind != "gpu" or not record.mig_enabled or record.details is None:
                continue
            found = _slots(nvml, record)
            if found:
                gpus.append(record)
                slots.extend(found)
        return cls(slots, gpus, source, state_dir)

    # -- what is published ------------------------------------------------------------------------

    def kept(self, records: Sequence[GpuRecord]) -> list[GpuRecord]:
        """``records`` without the (static) MIG devices of the GPUs dynamic MIG manages."""
        return [r for r in records if r.mig is None or r.mig.parent_uuid not in self.gpus]

    def _devices(self, slots: Sequence[MigSlot]) -> list[Device]:
        by_gpu: dict[str, list[MigSlot]] = {}
        for slot in slots:
            by_gpu.setdefault(slot.parent.uuid, []).append(slot)
        devices = []
        for gpu_uuid, gpu_slots in by_gpu.items():
            parent = self.gpus[gpu_uuid]
            assert parent.details is not None
            maxima = {c: max(s.capacity[c] for s in gpu_slots) for c in _CAPACITIES}
            slices = max(s.start + s.size for s in gpu_slots)
            counters = {_COUNTER[c]: binary_quantity(v) for c, v in maxima.items()}
            counters.update((memory_slice(i), "1") for i in range(slices))
            counter_set = CounterSet(name=counter_set_name(parent.minor), counters=counters)
            common = _common(parent, parent.details)
            for slot in sorted(gpu_slots, key=lambda s: s.name):
                consumed = {_COUNTER[c]: binary_quantity(v) for c, v in slot.capacity.items()}
                consumed.update((memory_slice(i), "1") for i in range(slot.start, slot.start + slot.size))
                devices.append(
                    Device(
                        id=slot.name,
                        name=slot.name,
                        numa_nodes=() if parent.numa_node is None else (parent.numa_node,),
                        attributes={
                            "type": "mig",
                            "parentUUID": parent.uuid,
                            "profile": slot.profile,
                            **common,
                        },
                        capacity={c: binary_quantity(slot.capacity[c]) for c in _CAPACITIES},
                        consumes_counters=(
                            CounterConsumption(counter_set=counter_set.name, counters=consumed),
                        ),
                        shared_counters=(counter_set,),
                    )
                )
        return devices

    # -- prepare and unprepare ------------------------------------------------------------------

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a dynamic MIG device."""
        return name in self.slots

    def create(self, claim_uid: str, names: Sequence[str]) -> dict[str, GpuRecord]:
        """Create the MIG devices ``names`` for claim ``claim_uid``; their records by name.

        Idempotent: devices the claim's state file lists as created are not created again. A
        failure destroys whatever this claim created before raising.

        Raises:
            DynamicMigError: a device could not be created (NVML's reason in the message).
        """
        done = self._read(claim_uid)
        made = {c.device: c for c in done if c.compute_instance is not None}
        if all(name in made for name in names):
            # All there (a repeated prepare, or a device shared by claims): nothing to undo.
            return {name: self._record(self.slots[name], made[name]) for name in names}
        try:
            with self.source.open() as nvml:
                for name in names:
                    if name not in made:
                        made[name] = self._create_one(nvml, claim_uid, self.slots[name], done)
                return {name: self._record(self.slots[name], made[name]) for name in names}
        except (NvmlError, DynamicMigError) as exc:
            try:
                self.destroy(claim_uid)
            except DynamicMigError as cleanup:
                log.error("dynamic_mig_rollback_failed", claim=claim_uid, error=str(cleanup))
            if isinstance(exc, DynamicMigError):
                raise
            raise DynamicMigError(f"creating MIG devices for claim {claim_uid}: {exc}") from None

    def destroy(self, claim_uid: str) -> None:
        """Destroy every MIG instance claim ``claim_uid`` created (compute instances first), then
        forget the claim. Instances already gone count as destroyed.

        Raises:
            DynamicMigError: NVML refused; the state file is kept for the next try.
        """
        done = self._read(claim_uid)
        if not done:
            self._state_file(claim_uid).unlink(missing_ok=True)
            return
        try:
            with self.source.open() as nvml:
                for created in reversed(done):
                    self._destroy_one(nvml, created)
        except NvmlError as exc:
            raise DynamicMigError(f"destroying the MIG devices of claim {claim_uid}: {exc}") from None
        self._state_file(claim_uid).unlink(missing_ok=True)
        log.info("dynamic_mig_destroyed", claim=claim_uid, devices=[c.device for c in done])

    def _create_one(self, nvml: Nvml, claim_uid: str, slot: MigSlot, done: list[Created]) -> Created:
        handle = nvml.call("nvmlDeviceGetHandleByUUID", slot.parent.uuid)
        info = nvml.call("nvmlDeviceGetGpuInstanceProfileInfo", handle, slot.gi_profile)
        placement = next(
            (
                p
                for p in _possible_placements(nvml, handle, int(info.id))
                if int(p.start) == slot.start and int(p.size) == slot.size
            ),
            None,
        )
        if placement is None:
            raise DynamicMigError(f"{slot.name}: placement {slot.start}+{slot.size} is no longer offered")
        try:
            gi = nvml.call(
                "nvmlDeviceCreateGpuInstanceWithPlacement", handle, info.id, ctypes.pointer(placement)
            )
        except NvmlError as exc:
            raise DynamicMigError(f"{slot.name}: creating the GPU instance failed: {exc}") from None
        gi_id = int(nvml.call("nvmlGpuInstanceGetInfo", gi).id)
        created = Created(slot.name, slot.parent.uuid, gi_id)
        done.append(created)
        self._write(claim_uid, done)
        try:
            ci_info = nvml.call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, slot.ci_profile, _CI_ENGINE_SHARED
            )
            ci = nvml.call("nvmlGpuInstanceCreateComputeInstance", gi, ci_info.id)
        except NvmlError as exc:
            raise DynamicMigError(f"{slot.name}: creating the compute instance failed: {exc}") from None
        ci_id = int(nvml.call("nvmlComputeInstanceGetInfo", ci).id)
        uuid = _mig_uuid(nvml, handle, gi_id, ci_id)
        created = dataclasses.replace(created, compute_instance=ci_id, uuid=uuid)
        done[-1] = created
        self._write(claim_uid, done)
        log.info("dynamic_mig_created", claim=claim_uid, device=slot.name, gpu_instance=gi_id, uuid=uuid)
        return created

    @staticmethod
    def _destroy_one(nvml: Nvml, created: Created) -> None:
        handle = nvml.call("nvmlDeviceGetHandleByUUID", created.parent_uuid)
        try:
            gi = nvml.call("nvmlDeviceGetGpuInstanceById", handle, created.gpu_instance)
        except NvmlError as exc:
            if exc.code in (_nvml.NOT_FOUND, _nvml.NOT_SUPPORTED):
                return  # gone already (or MIG mode is off): nothing to destroy
            raise
        if created.compute_instance is not None:
            try:
                ci = nvml.call("nvmlGpuInstanceGetComputeInstanceById", gi, created.compute_instance)
            except NvmlError as exc:
                if exc.code != _nvml.NOT_FOUND:
                    raise
            else:
                nvml.call("nvmlComputeInstanceDestroy", ci)
        nvml.call("nvmlGpuInstanceDestroy", gi)

    def _record(self, slot: MigSlot, created: Created) -> GpuRecord:
        """The record of a created MIG device, for its CDI spec (capability nodes)."""
        assert created.compute_instance is not None
        parent = slot.parent
        minors = read_mig_minors(self.source.proc) or {}
        mig = MigInfo(
            parent_uuid=parent.uuid,
            parent_index=int(parent.index),
            parent_minor=parent.minor,
            gpu_instance_id=created.gpu_instance,
            compute_instance_id=created.compute_instance,
            profile=slot.profile,
            cap_paths=mig_cap_paths(minors, parent.minor, created.gpu_instance, created.compute_instance),
        )
        return dataclasses.replace(
            parent, kind="mig", uuid=created.uuid or slot.name, mig=mig, mig_enabled=False
        )

    # -- the state files ---------------------------------------------------------------------------

    def _state_file(self, claim_uid: str) -> Path:
        return self.state_dir / f"{claim_uid}.json"

    def _read(self, claim_uid: str) -> list[Created]:
        path = self._state_file(claim_uid)
        try:
            entries = json.loads(path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise DynamicMigError(
                f"the dynamic MIG state of claim {claim_uid} cannot be read: {exc}"
            ) from None
        return [Created(**e) for e in entries]

    def _write(self, claim_uid: str, done: Sequence[Created]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self._state_file(claim_uid)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps([dataclasses.asdict(c) for c in done]))
        os.replace(temporary, path)


def _slots(nvml: Nvml, record: GpuRecord) -> list[MigSlot]:
    """The C == G profiles of one GPU at each of their possible placements."""
    assert record.details is not None
    handle = nvml.call("nvmlDeviceGetHandleByUUID", record.uuid)
    slots = []
    for index in range(_GI_PROFILE_COUNT):
        try:
            info = nvml.call("nvmlDeviceGetGpuInstanceProfileInfo", handle, index)
            placements = _possible_placements(nvml, handle, int(info.id))
        except NvmlError as exc:
            if exc.code in (_nvml.NOT_SUPPORTED, _nvml.INVALID_ARGUMENT):
                continue
            raise
        slices = int(info.sliceCount)
        if slices not in _CI_PROFILE:
            continue
        profile = mig_profile_name(
            gpu_slices=slices,
            compute_slices=slices,
            memory_mb=int(info.memorySizeMB),
            parent_memory_bytes=record.details.memory_bytes,
            gi_profile_id=index,
        )
        capacity = {
            "multiprocessors": int(info.multiprocessorCount),
            "copyEngines": int(info.copyEngineCount),
            "decoders": int(info.decoderCount),
            "encoders": int(info.encoderCount),
            "jpegEngines": int(info.jpegCount),
            "ofaEngines": int(info.ofaCount),
            "memory": int(info.memorySizeMB) * 1024 * 1024,
        }
        for placement in placements:
            start, size = int(placement.start), int(placement.size)
            slots.append(
                MigSlot(
                    name=mig_device_name(record.minor, profile, int(info.id), start),
                    parent=record,
                    profile=profile,
                    gi_profile=index,
                    gi_profile_id=int(info.id),
                    ci_profile=_CI_PROFILE[slices],
                    start=start,
                    size=size,
                    capacity=capacity,
                )
            )
    return slots


def _possible_placements(nvml: Nvml, handle: Any, profile_id: int) -> list[Any]:
    """Where GPU instances of ``profile_id`` may go, read as pynvml wants it: the count first
    (no array), then an array of the module's ``c_nvmlGpuInstancePlacement_t`` that size."""
    function = "nvmlDeviceGetGpuInstancePossiblePlacements"
    count = ctypes.c_uint(0)
    nvml.call(function, handle, profile_id, None, ctypes.pointer(count))
    if not count.value:
        return []
    array = (nvml.module.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.call(function, handle, profile_id, array, ctypes.pointer(count))
    return list(array[: count.value])


def _mig_uuid(nvml: Nvml, handle: Any, gi: int, ci: int) -> str | None:
    """The UUID of the MIG device of GPU instance ``gi`` / compute instance ``ci``."""
    count = int(nvml.call("nvmlDeviceGetMaxMigDeviceCount", handle))
    for index in range(count):
        try:
            mig = nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        except NvmlError:
            continue
        if int(nvml.call("nvmlDeviceGetGpuInstanceId", mig)) == gi and (
            int(nvml.call("nvmlDeviceGetComputeInstanceId", mig)) == ci
        ):
            uuid = nvml.call("nvmlDeviceGetUUID", mig)
            return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return None


# -- the plugin's hooks, wrapped -----------------------------------------------------------------


def shared_key(name: str) -> str:
    """The state file key of dynamic MIG device ``name`` shared by claims (consumable shares)."""
    return f"device-{name}"


def creates_mig_devices(prepare: P) -> P:
    """Wrap a plugin's ``prepare_claim``: the claim's dynamic MIG devices are created first
    (their records handed to the plugin's ``_by_name``), and destroyed again if the rest fails.
    With consumable shares (the plugin's ``consumable_shares`` set) a device is created once for
    all its claims, and destroyed on failure only if no other claim has a share of it."""

    inner = cast("Any", prepare)

    @functools.wraps(inner)
    async def wrapper(self: Any, claim: Claim, devices: Sequence[AllocatedDevice], config: Any) -> Any:
        dynamic: DynamicMig | None = getattr(self, "dynamic_mig", None)
        names = list(dict.fromkeys(d.name for d in devices if dynamic is not None and dynamic.owns(d.name)))
        if dynamic is None or not names:
            return await inner(self, claim, devices, config)
        if getattr(self, "consumable_shares", None) is not None:
            return await _shared(self, inner, claim, devices, config, dynamic=dynamic, names=names)
        records = await anyio.to_thread.run_sync(dynamic.create, claim.uid, names)
        self._by_name.update(records)
        try:
            return await inner(self, claim, devices, config)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(DynamicMigError):
                await anyio.to_thread.run_sync(dynamic.destroy, claim.uid)
            raise

    return cast("P", wrapper)


async def _shared(
    plugin: Any,
    inner: Any,
    claim: Claim,
    devices: Sequence[AllocatedDevice],
    config: Any,
    *,
    dynamic: DynamicMig,
    names: Sequence[str],
) -> Any:
    """``creates_mig_devices`` for devices shared by claims: each created under its own key."""
    alone = [n for n in names if not any(d.other_shares for d in devices if d.name == n)]
    made: list[str] = []
    try:
        for name in names:
            records = await anyio.to_thread.run_sync(dynamic.create, shared_key(name), [name])
            made.append(name)
            plugin._by_name.update(records)
        return await inner(plugin, claim, devices, config)
    except BaseException:
        with anyio.CancelScope(shield=True):
            for name in alone:
                if name in made:
                    with contextlib.suppress(DynamicMigError):
                        await anyio.to_thread.run_sync(dynamic.destroy, shared_key(name))
        raise


def destroys_mig_devices(unprepare: U) -> U:
    """Wrap a plugin's ``unprepare_claim``: the claim's dynamic MIG devices are destroyed after it."""

    inner = cast("Any", unprepare)

    @functools.wraps(inner)
    async def wrapper(self: Any, claim: Claim) -> None:
        await inner(self, claim)
        dynamic: DynamicMig | None = getattr(self, "dynamic_mig", None)
        if dynamic is not None:
            await anyio.to_thread.run_sync(dynamic.destroy, claim.uid)

    return cast("U", wrapper)


def dynamic_mig(
    settings: Any, nvml: Nvml, records: Iterable[GpuRecord], source: NvmlSource, plugin_dir: Path
) -> DynamicMig | None:
    """The node's dynamic MIG devices when ``DynamicMIG`` is on (None otherwise); the claims'
    state in ``<plugin_dir>/dynamic-mig``.

    Raises:
        NvmlError: NVML failed.
    """
    if not dynamic_mig_enabled(settings):
        return None
    found = DynamicMig.discover(nvml, records, source, plugin_dir / "dynamic-mig")
    log.info("dynamic_mig", gpus=len(found.gpus), devices=len(found.devices))
    return found
