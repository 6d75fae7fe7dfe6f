"""NodePrepareResources and NodeUnprepareResources, claim by claim (dra.md §4, §6, §7).

Prepare: read every claim from the API server (outside the lock), check its UID and that it is
allocated, parse its allocation once (:mod:`devplug._dra.allocation`; a malformed one is the
claim's error) and keep this driver's results and configs, then under the driver's lock:
answer again what the checkpoint holds (writing a CDI spec that has gone missing), or prepare afresh
(the plugin's ``prepare_claim``, else ``allocate`` once per request, its host paths checked as
the device-plugin Allocate checks them, written as one CDI spec for the claim; a hook may hand
over its own spec file, written and kept the same way), checkpoint, answer. A prepare that fails
before its claim is recorded is undone (``unprepare_claim`` of the plugins whose part was done,
the spec file). Unprepare: under the lock, from the checkpoint alone.

Every claim asked for gets an entry, an error of one claim never fails the others, and the
process never crashes on a request. A prepare that was already running when its claim was
unprepared (the kubelet gave up after 45 s and moved on) is refused when it gets the lock, so
it cannot leave a device prepared for a claim nobody will unprepare again.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import anyio

from devplug._cdi_files import write_atomically
from devplug._dra.allocation import AllocationError, PreparedEntry, parse_allocation
from devplug._dra.checkpoint import PreparedClaim
from devplug._dra.lock import DriverLock, LockTimeout, lock_wait
from devplug._dra.metadata import (
    CDI_CLASS,
    MetadataDevice,
    MetadataError,
    add_cdi_ids,
    claim_removal,
    plan_metadata,
    remove_metadata,
    write_metadata,
)
from devplug._dra.names import cdi_device, cdi_kind, claim_spec_file
from devplug._dra.slices import device_entry
from devplug._hooks import overrides
from devplug._quantity import quantity
from devplug._text import counted, os_error_text
from devplug.checks import HostPathError, check_host_paths
from devplug.models import AllocatedDevice, CdiSpecFile, Claim, ClaimRef, OpaqueConfig, PreparedDevice

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
    from pathlib import Path

    from devplug._dra.allocation import Allocation, DeviceConfig, DeviceResult
    from devplug._dra.checkpoint import Checkpoint
    from devplug._dra.claim_status import StatusWriter
    from devplug._dra.inventory import Inventory
    from devplug._dra.metadata import MetadataPlan, MetadataRemoval
    from devplug._resource_claim import ResourceClaimDict
    from devplug._runtime.ledger import Ledger
    from devplug.cdi import CdiSpec
    from devplug.checks import CheckMode
    from devplug.models import ContainerAllocation, Device
    from devplug.plugin import DevicePlugin


class ClaimError(Exception):
    """The reason one claim cannot be prepared or unprepared (its response's ``error``)."""


@dataclass
class Outcome:
    """One claim's answer: its devices, or an error."""

    devices: list[PreparedEntry] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class _Read:
    """A claim as read from the API server, its allocation parsed."""

    claim: dict[str, Any]
    allocation: Allocation


class Preparer:
    """Prepares and unprepares the claims of one driver; calls are serialized."""

    def __init__(
        self,
        *,
        driver: str,
        node: str,
        inventory: Inventory,
        checkpoint: Checkpoint,
        cdi_dir: Path,
        fetch_claim: Callable[[str, str], Awaitable[dict[str, Any]]],
        log: Any,
        lock_file: Path | None = None,
        host_path_check: CheckMode = "warn",
        host_root: Path | str = "/",
        metadata: MetadataOptions | None = None,
        status: StatusWriter | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.driver = driver
        self.ledger = ledger
        """Both APIs (or the migration mode): a device held through the device plugin is
        refused; the claims prepared are recorded in it."""
        self.node = node
        self.inventory = inventory
        self.checkpoint = checkpoint
        self.cdi_dir = cdi_dir
        self._fetch = fetch_claim
        self._log = log
        self._lock = DriverLock(lock_file, log)
        self._host_path_check: CheckMode = host_path_check
        self._host_root = host_root
        self._metadata = metadata
        self._status = status
        self._sequence = itertools.count(1)
        self._running: set[int] = set()  # start numbers of the prepares in progress
        self._unprepared: dict[str, int] = {}  # claim UID -> number of its last unprepare

    # -- prepare --------------------------------------------------------------------------------

    async def prepare(
        self, claims: Sequence[ClaimRef], *, time_left: float | None = None
    ) -> dict[str, Outcome]:
        """Prepare ``claims``; one outcome per distinct UID. ``time_left``: seconds before the
        call's deadline (None: none), which bounds the wait for the driver's lock."""
        give_up = anyio.current_time() + lock_wait(time_left)
        start = next(self._sequence)
        self._running.add(start)
        try:
            unique, outcomes = _distinct(claims)
            fetched: dict[str, _Read] = {}

            async def fetch(ref: ClaimRef) -> None:
                try:
                    fetched[ref.uid] = self._checked(ref, await self._fetch(ref.namespace, ref.name))
                except ClaimError as exc:
                    outcomes[ref.uid] = Outcome(error=str(exc))

            if len(unique) == 1:  # the usual request: no task group for one read
                await fetch(unique[0])
            else:
                async with anyio.create_task_group() as tg:
                    for ref in unique:
                        tg.start_soon(fetch, ref)
            try:
                async with self._serialized(give_up):
                    for ref in unique:
                        if ref.uid in outcomes:
                            continue
                        try:
                            outcomes[ref.uid] = Outcome(await self._prepare_one(ref, fetched[ref.uid], start))
                        except ClaimError as exc:
                            outcomes[ref.uid] = Outcome(error=str(exc))
                        except Exception as exc:  # a bug in a hook must not take the call down
                            self._log.exception("prepare_failed", claim=str(ref), uid=ref.uid, error=str(exc))
                            outcomes[ref.uid] = Outcome(error=f"prepare of claim {ref} failed: {exc}")
            except LockTimeout as exc:
                self._lock_timed_out(exc, [r for r in unique if r.uid not in outcomes], outcomes)
            return outcomes
        finally:
            self._running.discard(start)
            self._forget_unprepares()

    def check_host_paths(self, mode: CheckMode, root: Path | str) -> None:
        """Check the host paths of default prepares with ``mode`` under ``root`` from now on."""
        self._host_path_check = mode
        self._host_root = root

    def _checked(self, ref: ClaimRef, claim: dict[str, Any]) -> _Read:
        """The claim's allocation, read once here for the rest of the prepare.

        Raises:
            ClaimError: the claim is another one by now, not allocated, or its allocation is
                malformed (the message names the field).
        """
        metadata = claim.get("metadata") if isinstance(claim, dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        if uid != ref.uid:
            raise ClaimError(f"claim {ref} got replaced: its UID is {uid}, the kubelet asked for {ref.uid}")
        try:
            allocation = parse_allocation(claim)
        except AllocationError as exc:
            raise ClaimError(f"claim {ref}: malformed allocation: {exc}") from None
        if allocation is None:
            raise ClaimError(f"claim {ref} is not allocated")
        return _Read(claim, allocation)

    async def _prepare_one(self, ref: ClaimRef, read: _Read, start: int) -> list[PreparedEntry]:
        self._refuse_if_unusable()
        if self._unprepared.get(ref.uid, 0) > start:
            raise ClaimError(
                f"claim {ref} was unprepared while this prepare was in progress; refusing to prepare it late"
            )
        done = self.checkpoint.claims.get(ref.uid)
        if done is not None:
            _check_recorded_shares(ref, done, read.allocation.results_of(self.driver))
            await self._restore_spec(done)
            await self._restore_metadata(ref, read, done)
            self._report(ref, done)
            self._log.info("claim_prepared_again", claim=str(ref), uid=ref.uid)
            return done.devices
        devices = self._devices_of(ref, read.allocation.results_of(self.driver))
        configs = [_opaque(c) for c in read.allocation.configs_of(self.driver)]
        record = PreparedClaim(ref.uid, ref.namespace, ref.name)
        entries = self.inventory.current.by_name
        by_plugin: dict[int, list[AllocatedDevice]] = {}
        plugins = {id(p): p for p in self.inventory.plugins}
        for device in devices:
            by_plugin.setdefault(id(entries[device.name].plugin), []).append(device)
        resource = cast("ResourceClaimDict", read.claim)  # what the API server sent, checked above
        full = Claim(uid=ref.uid, namespace=ref.namespace, name=ref.name, resource_claim=resource)
        edits: dict[str, ContainerAllocation] = {}
        own_spec: CdiSpecFile | None = None  # a spec file a prepare_claim hook handed over
        done_by: list[DevicePlugin] = []  # the plugins whose part of the claim is done
        stamp = _now()  # the reported conditions' lastTransitionTime
        self._hold(ref, devices)
        try:
            for key, group in by_plugin.items():
                plugin = plugins[key]
                prepared = None
                if overrides(type(plugin), "prepare_claim"):
                    prepared = await plugin.prepare_claim(
                        full, group, [c for c in configs if _covers(c, group)]
                    )
                    # From here the hook's work (MPS daemons, time slices, ...) stands, and only
                    # its unprepare_claim undoes it; a hook that raises undoes its own.
                    done_by.append(plugin)
                if prepared is None:
                    prepared = await self._default(plugin, ref, group, edits)
                    if plugin not in done_by:
                        done_by.append(plugin)
                record.devices.extend(_answer(self.node, group, prepared, stamp))
                record.resources.append(plugin.resource_name)
                own_spec = _handed_spec(ref, own_spec, prepared)
            _record_spec(record, self.driver, ref, edits, own_spec)
            metadata = self._metadata_plan(ref, read, devices)
            if metadata is not None:
                record.devices = add_cdi_ids(record.devices, metadata.cdi_device_ids)
            # One trip to a worker thread: the metadata and the spec first (they must exist
            # before the kubelet is answered), then the checkpoint that records them.
            await anyio.to_thread.run_sync(self._persist, ref, record, metadata)
        except BaseException:
            if ref.uid not in self.checkpoint.claims:
                # Nothing recorded, so no unprepare will come for this claim: undo what was done
                # for it, as an unprepare would, even when the call is being cancelled (the
                # kubelet's deadline), or the node keeps what the hooks set up.
                with anyio.CancelScope(shield=True):
                    await self._undo(ref, record, done_by)
            raise
        self._log.info("claim_prepared", claim=str(ref), uid=ref.uid, devices=[d.name for d in devices])
        self._report(ref, record)
        return record.devices

    def _devices_of(self, ref: ClaimRef, results: list[DeviceResult]) -> list[AllocatedDevice]:
        """This driver's ``results`` as the plugins' devices.

        A device is prepared for one claim at a time, unless shared: then each of its shares
        (distinct share IDs) may be prepared for a claim, as long as what the shares consume
        together stays within the device's capacity. Admin access takes nothing and is refused
        nothing.

        Raises:
            ClaimError: a device is in another pool, not this driver's, prepared for another
                claim, or its share is taken or does not fit (the message names which).
        """
        snapshot = self.inventory.current
        holders: dict[str, list[tuple[PreparedClaim, PreparedEntry]]] = {}
        for claim in self.checkpoint.claims.values():
            for prepared in claim.devices:
                if not prepared.admin_access:
                    holders.setdefault(prepared.device, []).append((claim, prepared))
        out = []
        for result in results:
            pool, name = result.pool, result.device
            if pool != self.node:
                raise ClaimError(
                    f"claim {ref}: device {name} is in pool {pool!r}, not this node's pool {self.node!r}"
                )
            entry = snapshot.by_name.get(name)
            if entry is None:
                raise ClaimError(
                    f"claim {ref}: device {name} is not one of driver {self.driver}'s devices on {self.node}"
                )
            others = holders.get(name, [])
            if not result.admin_access and self.ledger is not None:
                self._refuse_if_held(ref, name)
            if not result.admin_access:
                _check_share(ref, entry.device, name, result, others)
                # Later results of this claim weigh this one too (a claim may have two shares).
                holders.setdefault(name, []).append(
                    (
                        PreparedClaim(ref.uid, ref.namespace, ref.name),
                        PreparedEntry(
                            device=name,
                            pool=pool,
                            share_id=result.share_id,
                            consumed_capacity=result.consumed_capacity,
                        ),
                    )
                )
            out.append(
                AllocatedDevice(
                    request=result.request,
                    name=name,
                    pool=pool,
                    device=entry.device,
                    admin_access=result.admin_access,
                    share_id=result.share_id,
                    consumed_capacity=dict(result.consumed_capacity),
                    other_shares=tuple(p.share_id for c, p in others if p.share_id and c.uid != ref.uid),
                )
            )
        return out

    def _hold(self, ref: ClaimRef, devices: list[AllocatedDevice]) -> None:
        """Record the claim's devices in the ledger, before any await: an Allocate that comes
        meanwhile sees them held."""
        if self.ledger is not None:
            held = [d.name for d in devices if not d.admin_access]
            self.ledger.prepared(ref.uid, f"{ref.namespace}/{ref.name}", held)

    def _refuse_if_held(self, ref: ClaimRef, name: str) -> None:
        """Refuse a device a pod holds through the device-plugin API (the last step of a race:
        the slices carry a taint as soon as the holder is known).

        Raises:
            ClaimError: naming the pod that holds it.
        """
        assert self.ledger is not None
        why = self.ledger.from_dra(name)
        if why is None:
            return
        if self.ledger.refused("prepare", name, why):
            self._log.warning(
                "prepare_refused_held", claim=str(ref), device=name, holder=why.holder, api=why.api
            )
        raise ClaimError(f"claim {ref}: device {name} is {why}")

    async def _default(
        self,
        plugin: DevicePlugin,
        ref: ClaimRef,
        devices: list[AllocatedDevice],
        edits: dict[str, ContainerAllocation],
    ) -> list[PreparedDevice]:
        """``allocate`` once per request: one CDI device per request, named on its first device.

        All devices of a request go to the same containers, and the CDI name is given once so
        that a runtime never applies the same edits twice.
        """
        kind = cdi_kind(self.driver)
        answer = []
        for request, group in itertools.groupby(
            sorted(devices, key=lambda d: d.request_name), key=lambda d: d.request_name
        ):
            members = list(group)
            allocation = await plugin.allocate([d.device for d in members])
            if allocation.devices or allocation.mounts:
                self._check_host_paths(ref, [d.device.id for d in members], allocation)
            name = cdi_device(ref.uid, request)
            edits[name] = allocation
            ids = (f"{kind}={name}", *allocation.cdi_devices)
            for i, device in enumerate(members):
                answer.append(
                    PreparedDevice(
                        name=device.name,
                        requests=(request,),
                        cdi_devices=ids if i == 0 else (),
                        share_id=device.share_id,
                    )
                )
        return answer

    def _check_host_paths(self, ref: ClaimRef, ids: list[str], allocation: ContainerAllocation) -> None:
        """The device-plugin Allocate's check (``host_path_check``, ``host_root``): a host path
        that is missing passes the kubelet and fails in the container runtime, far from its cause.

        Raises:
            ClaimError: ``refuse``, and a device node or mount of ``allocation`` will not work.
        """
        log = self._log.bind(claim=str(ref), uid=ref.uid)
        try:
            check_host_paths(allocation, mode=self._host_path_check, root=self._host_root, log=log)
        except HostPathError as exc:
            log.error("allocate_refused", devices=ids, error=str(exc))
            raise ClaimError(f"claim {ref}: allocate for {ids}: {exc}") from None

    def _report(self, ref: ClaimRef, record: PreparedClaim) -> None:
        """Have the claim's ``status.devices`` show what its devices report, if any do."""
        if self._status is None:
            return
        entries = [
            {
                "driver": self.driver,
                "pool": d.pool,
                "device": d.device,
                **({"shareID": d.share_id} if d.share_id else {}),
                **d.status,
            }
            for d in record.devices
            if d.status is not None
        ]
        if entries:
            self._status.publish(ref, entries)

    def _metadata_plan(
        self, ref: ClaimRef, read: _Read, devices: list[AllocatedDevice]
    ) -> MetadataPlan | None:
        """The claim's device metadata files (``device_metadata`` on), else None.

        Raises:
            ClaimError: a name cannot be written as metadata (the message says which).
        """
        if self._metadata is None or not self._metadata.enabled or not devices:
            return None
        entries = self.inventory.current.by_name
        described = [
            MetadataDevice.from_slice(
                d.request, d.pool, device_entry(entries[d.name], self.driver, taint_unhealthy=False)
            )
            for d in devices
        ]
        try:
            return plan_metadata(
                self.driver,
                read.claim,
                described,
                host_dir=self._metadata.host_dir,
                cdi_dir=self.cdi_dir,
                versions=self._metadata.versions,
            )
        except (MetadataError, ValueError) as exc:
            raise ClaimError(f"claim {ref}: device metadata: {exc}") from None

    async def _restore_metadata(self, ref: ClaimRef, read: _Read, record: PreparedClaim) -> None:
        """Write again the metadata files of a claim prepared with them that have gone missing
        (a reboot empties /var/run/cdi, where their CDI specs are)."""
        if self._metadata is None or not _has_metadata(self.driver, record):
            return
        results = read.allocation.results_of(self.driver)
        try:
            plan = self._metadata_plan(ref, read, self._devices_of_record(results))
        except ClaimError as exc:
            self._log.warning("metadata_not_restored", claim=str(ref), uid=ref.uid, error=str(exc))
            return
        if plan is None:
            return
        missing = [f for f in plan.files if not f.path.exists()]
        if missing:
            try:
                await anyio.to_thread.run_sync(write_metadata, replace(plan, files=tuple(missing)))
            except OSError as exc:
                raise ClaimError(f"claim {ref}: {os_error_text(exc, 'write the device metadata')}") from None
            self._log.info("metadata_restored", claim=str(ref), files=[str(f.path) for f in missing])

    def _devices_of_record(self, results: list[DeviceResult]) -> list[AllocatedDevice]:
        """The claim's devices this driver still lists, as at prepare (for its metadata)."""
        by_name = self.inventory.current.by_name
        return [
            AllocatedDevice(request=r.request, name=r.device, pool=r.pool, device=by_name[r.device].device)
            for r in results
            if r.device in by_name
        ]

    def _metadata_removal(self, ref: ClaimRef, record: PreparedClaim) -> MetadataRemoval | None:
        """What the claim's metadata left on the node, less what another prepared claim of the
        same name (deleted and made again) has in the same place; None if it had none."""
        if not _has_metadata(self.driver, record):
            return None
        host_dir = self._metadata.host_dir if self._metadata else None
        if host_dir is None:
            return None

        def removal(uid: str, claim: PreparedClaim) -> MetadataRemoval:
            requests = {r for d in claim.devices for r in d.requests}
            return claim_removal(
                self.driver,
                uid,
                claim.namespace,
                claim.name,
                requests,
                host_dir=host_dir,
                cdi_dir=self.cdi_dir,
            )

        mine = removal(ref.uid, record)
        kept = {
            path
            for uid, other in self.checkpoint.claims.items()
            if uid != ref.uid and (other.namespace, other.name) == (record.namespace, record.name)
            for path in removal(uid, other).files
        }
        return replace(mine, files=tuple(p for p in mine.files if p not in kept))

    def _persist(self, ref: ClaimRef, record: PreparedClaim, metadata: MetadataPlan | None = None) -> None:
        """Write ``metadata``'s files and ``record``'s spec, then checkpoint it (in a worker thread).

        Raises:
            ClaimError: any could not be written; the claim is then not recorded.
        """
        if metadata is not None:
            try:
                write_metadata(metadata)
            except OSError as exc:
                raise ClaimError(f"claim {ref}: {os_error_text(exc, 'write the device metadata')}") from None
        if record.spec_file:
            self._write_spec(record)
        self.checkpoint.claims[ref.uid] = record
        try:
            self.checkpoint.save()
        except OSError as exc:
            del self.checkpoint.claims[ref.uid]
            raise ClaimError(f"claim {ref}: {os_error_text(exc, 'write the checkpoint')}") from None

    async def _restore_spec(self, record: PreparedClaim) -> None:
        if record.spec_file and not (self.cdi_dir / record.spec_file).exists():
            await anyio.to_thread.run_sync(self._write_spec, record)
            self._log.info(
                "cdi_spec_restored", claim=f"{record.namespace}/{record.name}", file=record.spec_file
            )

    def _write_spec(self, record: PreparedClaim) -> None:
        assert record.spec_file is not None
        assert record.spec_text is not None
        try:
            write_atomically(self.cdi_dir, record.spec_file, record.spec_text.encode(), 0o644)
        except OSError as exc:
            raise ClaimError(
                os_error_text(exc, f"write the CDI spec {self.cdi_dir / record.spec_file}")
            ) from None

    # -- unprepare ------------------------------------------------------------------------------

    async def unprepare(
        self, claims: Sequence[ClaimRef], *, time_left: float | None = None
    ) -> dict[str, Outcome]:
        """Unprepare ``claims`` from the checkpoint alone; unknown claims succeed. ``time_left``:
        as for :meth:`prepare`."""
        give_up = anyio.current_time() + lock_wait(time_left)
        unique, outcomes = _distinct(claims)
        try:
            async with self._serialized(give_up):
                for ref in unique:
                    self._unprepared[ref.uid] = next(self._sequence)
                    try:
                        self._refuse_if_unusable()
                        await self._unprepare_one(ref)
                        outcomes[ref.uid] = Outcome()
                    except ClaimError as exc:
                        outcomes[ref.uid] = Outcome(error=str(exc))
                    except Exception as exc:
                        self._log.exception("unprepare_failed", claim=str(ref), uid=ref.uid, error=str(exc))
                        outcomes[ref.uid] = Outcome(error=f"unprepare of claim {ref} failed: {exc}")
        except LockTimeout as exc:
            self._lock_timed_out(exc, unique, outcomes)
        return outcomes

    async def _unprepare_one(self, ref: ClaimRef) -> None:
        record = self.checkpoint.claims.get(ref.uid)
        if record is None:
            self._log.info("claim_not_prepared", claim=str(ref), uid=ref.uid)
            return
        claim = Claim(uid=ref.uid, namespace=record.namespace, name=record.name)
        for plugin in self.inventory.plugins:
            if plugin.resource_name in record.resources and overrides(type(plugin), "unprepare_claim"):
                await plugin.unprepare_claim(claim)
        for plugin, name in self._released(ref.uid, record):
            await plugin.release_device(name)
        # One trip to a worker thread: the spec goes, then the checkpoint that recorded it.
        await anyio.to_thread.run_sync(self._forget, ref, record)
        if self.ledger is not None:
            self.ledger.unprepared(ref.uid)
        if self._status is not None and any(d.status is not None for d in record.devices):
            self._status.withdraw(ref)
        self._log.info("claim_unprepared", claim=str(ref), uid=ref.uid)

    def _forget(self, ref: ClaimRef, record: PreparedClaim) -> None:
        """Remove ``record``'s spec, then drop it from the checkpoint (in a worker thread).

        Raises:
            ClaimError: the checkpoint could not be written; the claim stays recorded.
        """
        if record.spec_file:
            with contextlib.suppress(FileNotFoundError):
                (self.cdi_dir / record.spec_file).unlink()
        removal = self._metadata_removal(ref, record)
        if removal is not None:
            try:
                remove_metadata(removal)
            except OSError as exc:
                raise ClaimError(f"claim {ref}: {os_error_text(exc, 'remove the device metadata')}") from None
        del self.checkpoint.claims[ref.uid]
        try:
            self.checkpoint.save()
        except OSError as exc:
            self.checkpoint.claims[ref.uid] = record
            raise ClaimError(f"claim {ref}: {os_error_text(exc, 'write the checkpoint')}") from None

    def _released(self, uid: str, record: PreparedClaim) -> list[tuple[DevicePlugin, str]]:
        """The devices of ``record`` (claim ``uid``) that no other prepared claim holds once it
        goes, with the plugin whose ``release_device`` is called for each (the one that lists
        the device now, else the claim's only plugin; admin access held nothing)."""
        held = {
            d.device
            for other, claim in self.checkpoint.claims.items()
            if other != uid
            for d in claim.devices
            if not d.admin_access
        }
        mine = [p for p in self.inventory.plugins if p.resource_name in record.resources]
        by_name = self.inventory.current.by_name
        out: list[tuple[DevicePlugin, str]] = []
        for name in dict.fromkeys(d.device for d in record.devices if not d.admin_access):
            if name in held:
                continue
            entry = by_name.get(name)
            owner = entry.plugin if entry is not None and entry.plugin in mine else None
            if owner is None and len(mine) == 1:
                owner = mine[0]
            if owner is not None and overrides(type(owner), "release_device"):
                out.append((owner, name))
        return out

    async def _undo(self, ref: ClaimRef, record: PreparedClaim, plugins: Sequence[DevicePlugin]) -> None:
        """Roll back a prepare that failed before it was recorded: ``unprepare_claim`` of each of
        ``plugins`` (last first), then the spec file. A failing hook is logged, not raised: the
        prepare's own error is the one the kubelet must see."""
        if self.ledger is not None:
            self.ledger.unprepared(ref.uid)
        claim = Claim(uid=ref.uid, namespace=ref.namespace, name=ref.name)
        steps: list[tuple[str, Callable[[], Awaitable[None]], dict[str, str]]] = [
            ("unprepare_claim", partial(p.unprepare_claim, claim), {"resource": p.resource_name})
            for p in reversed(plugins)
            if overrides(type(p), "unprepare_claim")
        ]
        steps += [
            ("release_device", partial(p.release_device, name), {"device": name})
            for p, name in self._released(ref.uid, record)
            if p in plugins
        ]
        for hook, call, where in steps:
            try:
                await call()
            except Exception as exc:
                self._log.exception(
                    "rollback_failed",
                    claim=str(ref),
                    uid=ref.uid,
                    **where,
                    error=str(exc),
                    note=f"{hook} failed while undoing a failed prepare; the node may keep its state",
                )
        if record.spec_file:
            path = self.cdi_dir / record.spec_file
            with contextlib.suppress(FileNotFoundError):
                await anyio.to_thread.run_sync(path.unlink)
        removal = self._metadata_removal(ref, record)
        if removal is not None:
            try:
                await anyio.to_thread.run_sync(remove_metadata, removal)
            except OSError as exc:
                self._log.warning("rollback_failed", claim=str(ref), uid=ref.uid, error=str(exc))

    # -- serialization --------------------------------------------------------------------------

    def _refuse_if_unusable(self) -> None:
        if self.checkpoint.error:
            raise ClaimError(self.checkpoint.error)

    @contextlib.asynccontextmanager
    async def _serialized(self, give_up: float) -> AsyncIterator[None]:
        """The driver's lock (:mod:`devplug._dra.lock`), and the checkpoint as the other holder
        of a shared lock file may have left it.

        Raises:
            LockTimeout: the lock was not had by ``give_up``; the block did not run.
        """
        async with self._lock.held(give_up):
            # No worker thread when nobody wrote the checkpoint since (the common case): a trip
            # to a worker thread costs more than the call.
            if self._lock.path is not None and not self.checkpoint.unchanged():
                await anyio.to_thread.run_sync(self.checkpoint.load)
            yield

    def _lock_timed_out(
        self, exc: LockTimeout, refs: Sequence[ClaimRef], outcomes: dict[str, Outcome]
    ) -> None:
        self._log.warning(
            "lock_wait_expired",
            lock=exc.lock,
            waited=round(exc.waited, 1),
            claims=[str(r) for r in refs],
            error=str(exc),
        )
        for ref in refs:
            outcomes[ref.uid] = Outcome(error=str(exc))

    def _forget_unprepares(self) -> None:
        # Only prepares already running can be refused by an unprepare: older marks are moot.
        oldest = min(self._running, default=None)
        if oldest is None:
            self._unprepared.clear()
        else:
            for uid in [u for u, n in self._unprepared.items() if n < oldest]:
                del self._unprepared[uid]


def _distinct(claims: Sequence[ClaimRef]) -> tuple[list[ClaimRef], dict[str, Outcome]]:
    """The claims by UID, first occurrence kept; a UID named twice differently is an error."""
    unique: dict[str, ClaimRef] = {}
    outcomes: dict[str, Outcome] = {}
    for ref in claims:
        if not (ref.uid and ref.namespace and ref.name):
            outcomes[ref.uid] = Outcome(error=f"claim {ref} (UID {ref.uid!r}) lacks a UID, namespace or name")
            continue
        first = unique.setdefault(ref.uid, ref)
        if first != ref:
            outcomes[ref.uid] = Outcome(
                error=f"claim UID {ref.uid} is named twice in one request: {first} and {ref}"
            )
    return [r for r in unique.values() if r.uid not in outcomes], outcomes


def _opaque(config: DeviceConfig) -> OpaqueConfig:
    """A config as the ``prepare_claim`` hook gets it."""
    return OpaqueConfig(source=config.source, requests=config.requests, parameters=dict(config.parameters))


def _covers(config: OpaqueConfig, devices: list[AllocatedDevice]) -> bool:
    return any(config.applies_to(d.request) for d in devices)


def _handed_spec(
    ref: ClaimRef, found: CdiSpecFile | None, prepared: Sequence[PreparedDevice]
) -> CdiSpecFile | None:
    """The one spec file ``prepared`` (and the earlier answers, ``found``) hand over, if any."""
    for item in prepared:
        spec = item.cdi_spec_file
        if spec is None or spec == found:
            continue
        if found is not None:
            raise ClaimError(
                f"claim {ref}: prepare_claim handed over two CDI specs ({found.name} and "
                f"{spec.name}, or two texts of one file); a claim has one spec file"
            )
        found = spec
    return found


def _record_spec(
    record: PreparedClaim,
    driver: str,
    ref: ClaimRef,
    edits: dict[str, ContainerAllocation],
    handed: CdiSpecFile | None,
) -> None:
    """Note the claim's spec file in ``record``: devplug's default one for ``edits``, or the one
    a hook handed over."""
    if edits and handed is not None:
        raise ClaimError(
            f"claim {ref}: a prepare_claim hook handed over the CDI spec {handed.name} "
            "while devplug writes the claim's default spec; a claim has one spec file"
        )
    if edits:
        record.spec_file = claim_spec_file(driver, ref.uid)
        record.spec_text = _claim_spec(driver, ref.uid, edits).to_json()
    elif handed is not None:
        record.spec_file, record.spec_text = handed.name, handed.text


def _now() -> str:
    """Now, as the API writes times (RFC 3339, whole seconds, UTC)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _answer(
    node: str, devices: list[AllocatedDevice], prepared: Sequence[PreparedDevice], stamp: str = ""
) -> list[PreparedEntry]:
    """The kubelet's Device entries for what a plugin prepared (checked against what was asked)."""
    asked: dict[str, list[AllocatedDevice]] = {}
    for device in devices:
        asked.setdefault(device.name, []).append(device)
    out = []
    for item in prepared:
        if not isinstance(item, PreparedDevice) or item.name not in asked:
            got = item.name if isinstance(item, PreparedDevice) else type(item).__name__
            raise ClaimError(f"prepare_claim returned {got}, which is not a device of this claim")
        device = _asked_share(item, asked[item.name])
        out.append(
            PreparedEntry(
                device=item.name,
                pool=node,
                requests=item.requests or (device.request_name,),
                cdi_device_ids=item.cdi_devices,
                admin_access=device.admin_access,
                share_id=device.share_id,
                consumed_capacity=device.consumed_capacity,
                status=item.status.as_dict(stamp or _now()) if item.status is not None else None,
            )
        )
    return out


def _asked_share(item: PreparedDevice, candidates: list[AllocatedDevice]) -> AllocatedDevice:
    """The allocated device ``item`` answers for: the only one of its name, or the share it names."""
    if item.share_id is not None:
        for device in candidates:
            if device.share_id == item.share_id:
                return device
        raise ClaimError(
            f"prepare_claim returned device {item.name} with share {item.share_id}, "
            "which is not a share of this claim"
        )
    if len(candidates) > 1:
        raise ClaimError(
            f"prepare_claim returned device {item.name} without its share_id, and the claim has "
            f"{len(candidates)} shares of it: say which one each answer is for"
        )
    return candidates[0]


@dataclass(frozen=True)
class MetadataOptions:
    """Device metadata: whether prepares write it (``device_metadata``), where its files go and
    the versions they hold. Given with ``enabled`` False too, so that an unprepare still removes
    what a prepare made while it was on."""

    host_dir: Path
    versions: tuple[str, ...]
    enabled: bool = True


def _has_metadata(driver: str, record: PreparedClaim) -> bool:
    """Whether the claim was prepared with device metadata: its answer names a metadata CDI device."""
    mark = f"{driver}/{CDI_CLASS}="
    return any(i.startswith(mark) for d in record.devices for i in d.cdi_device_ids)


def _check_recorded_shares(ref: ClaimRef, record: PreparedClaim, results: list[DeviceResult]) -> None:
    """Refuse to answer a prepared claim again when its allocation names a share the checkpoint
    did not record for it (the answer kept would name other shares than the kubelet's claim).

    Raises:
        ClaimError: naming the share and what the checkpoint holds.
    """
    recorded = {(d.device, d.share_id) for d in record.devices if d.share_id}
    for result in results:
        if result.share_id and (result.device, result.share_id) not in recorded:
            kept = ", ".join(sorted(f"{d} share {s}" for d, s in recorded)) or "no shares"
            raise ClaimError(
                f"claim {ref}: its allocation names share {result.share_id} of device "
                f"{result.device}, which the checkpoint does not record for it (it holds {kept}); "
                "unprepare the claim before it is prepared with other shares"
            )


def _check_share(
    ref: ClaimRef,
    device: Device,
    name: str,
    result: DeviceResult,
    others: list[tuple[PreparedClaim, PreparedEntry]],
) -> None:
    """Refuse ``result`` where the device's other prepared uses (``others``) rule it out.

    Raises:
        ClaimError: the device is given whole to another claim or asked whole while in use, is
            not shared, the share is taken, or the shares would consume more than the device has.
    """

    def owner(claim: PreparedClaim) -> str:
        return f"{claim.namespace}/{claim.name} ({claim.uid})"

    if result.share_id is None or not device.allow_multiple_allocations:
        if others:
            what = "" if result.share_id is None else f" (share {result.share_id}; the device is not shared)"
            raise ClaimError(
                f"claim {ref}: device {name}{what} is already prepared for claim {owner(others[0][0])}"
            )
        return
    for claim, prepared in others:
        if prepared.share_id is None:
            raise ClaimError(f"claim {ref}: device {name} is already prepared whole for claim {owner(claim)}")
        if prepared.share_id == result.share_id:
            raise ClaimError(
                f"claim {ref}: share {result.share_id} of device {name} is already prepared "
                f"for claim {owner(claim)}"
            )
    for capacity, amount in result.consumed_capacity.items():
        if capacity not in device.capacity:
            raise ClaimError(
                f"claim {ref}: share {result.share_id} consumes {amount} of {capacity}, "
                f"which device {name} does not have"
            )
        try:
            used = sum(
                (quantity(p.consumed_capacity.get(capacity, "0")) for _, p in others), quantity(amount)
            )
        except ValueError as exc:
            raise ClaimError(f"claim {ref}: share {result.share_id} of device {name}: {exc}") from None
        if used > quantity(device.capacity[capacity]):
            raise ClaimError(
                f"claim {ref}: share {result.share_id} of device {name} consumes {amount} of "
                f"{capacity}: with its {counted(len(others), 'other share')} that passes "
                f"the device's {device.capacity[capacity]}"
            )


def _claim_spec(driver: str, uid: str, edits: dict[str, ContainerAllocation]) -> CdiSpec:
    from devplug.cdi import CdiDevice, CdiMount, CdiSpec, ContainerEdits, DeviceNode

    devices = []
    for name, allocation in sorted(edits.items()):
        container_edits = ContainerEdits(
            env=tuple(f"{k}={v}" for k, v in sorted(allocation.envs.items())),
            device_nodes=tuple(
                DeviceNode(
                    path=d.container_path,
                    host_path=d.host_path if d.host_path != d.container_path else None,
                    permissions=d.permissions,
                )
                for d in allocation.devices
            ),
            mounts=tuple(
                CdiMount(
                    host_path=m.host_path,
                    container_path=m.container_path,
                    options=("ro" if m.read_only else "rw", "nosuid", "nodev", "bind"),
                )
                for m in allocation.mounts
            ),
        )
        devices.append(
            CdiDevice(name=name, annotations=dict(allocation.annotations), container_edits=container_edits)
        )
    return CdiSpec(kind=cdi_kind(driver), devices=tuple(devices))
