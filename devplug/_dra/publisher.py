"""Keeps the node's ResourceSlices equal to the driver's devices, whoever deletes or edits them.

An informer (list, then watch from the list's resourceVersion; list again whenever the watch
breaks) keeps a cache of the driver's slices on this node; every write's answer goes into the
cache at once, so a reconcile never acts on a view older than its own last write. The
reconciler runs whenever the devices, the cache or the clock (every minute) say so: it plans the
writes (:func:`devplug._dra.slices.plan`) and makes them, a few at a time. A failed write is one
log line naming the object, the verb and the status, and the reconcile is retried with capped,
jittered back-off, forever: prepares are served meanwhile from what the kubelet already has.
Any other error (an object from the server that is not what it should be, a bug) is logged with
its traceback and retried the same way: nothing here ends the driver.

The kubelet deletes every slice of its node when it starts: the watch reports the deletions and
the slices are written again within milliseconds.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio

from devplug._dra.kube import KubeError
from devplug._dra.slices import (
    Plan,
    Pool,
    chunks,
    consumption_problem,
    counter_set_entry,
    declared_counter_sets,
    device_entry,
    is_list,
    list_attributes,
    partition_type_problem,
    plan,
    schedulable,
)
from devplug._runtime.backoff import Backoff
from devplug._versioned import Versioned

if sys.version_info < (3, 11):  # anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

if TYPE_CHECKING:
    from devplug._dra.inventory import Inventory, Snapshot
    from devplug._dra.kube import Kube
    from devplug._runtime.ledger import Ledger
    from devplug.models import CounterSet

RESYNC = 60.0
"""Seconds between reconciles when nothing happens (a missed event cannot outlive this)."""
PARALLEL_WRITES = 8
SETTLE = 0.01
"""Seconds a burst of deletions gets to arrive before the pool is written again."""


class SlicePublisher:
    """Publishes one driver's devices on one node."""

    def __init__(
        self,
        kube: Kube,
        *,
        driver: str,
        node: str,
        inventory: Inventory,
        log: Any,
        list_attributes: bool = False,
        ledger: Ledger | None = None,
    ) -> None:
        self.kube = kube
        self.ledger = ledger
        """Both APIs (or the migration mode): devices held through the device plugin are
        tainted ``<driver>/device-plugin`` (``NoSchedule``), left out where taints are dropped;
        nothing is published before the holders are known."""
        self.list_attributes = list_attributes
        """The driver publishes list attributes (its ``list_attributes`` setting)."""
        self.driver = driver
        self.node = node
        self.inventory = inventory
        self._log = log.bind(driver=driver, node=node)
        self._cache: dict[str, dict[str, Any]] = {}
        self._dirty = Versioned(None)
        """Bumped by everything that may call for a reconcile."""
        self._pool: Pool | None = None
        self._generation = 0
        self._settle = False
        self._wanted_cache: tuple[tuple[int | bool, ...], list[list[dict[str, Any]]]] | None = None
        self.taints_supported = True
        """False once the API server has dropped a device taint: unhealthy devices are left out."""
        self.counters_supported = True
        """False once the API server has dropped shared counters (DRAPartitionableDevices off):
        counter sets and the devices that consume counters are left out."""
        self.shares_supported = True
        """False once the API server has dropped ``allowMultipleAllocations`` (DRAConsumableCapacity
        off, Kubernetes < 1.36 by default): shared devices are published as ordinary ones, each
        allocated to one claim at a time."""
        self.bindings_supported = True
        """False once the API server has dropped binding conditions (DRADeviceBindingConditions
        off, Kubernetes < 1.36 by default): devices with binding conditions are left out."""
        self.partition_types_supported = True
        """False once the API server has dropped ``partitionTypeAttribute``
        (DRAPartitionableDevicesType off, the default in 1.37): slices go without it."""
        self.lists_supported = True
        """False once the API server has refused list attributes (DRAListTypeAttributes off, the
        default through 1.37: it drops the values, and the empty attribute is invalid): they are
        left out, and ``resource.kubernetes.io/numaNode`` is the first node."""
        self._lists_noted = False
        self.effect_none_supported = True
        """False once the API server has refused a taint of effect ``None`` (Kubernetes 1.34):
        such taints are left out."""
        self.in_sync = False
        """The last reconcile found the API server's slices equal to the devices."""
        self.synced_at: float | None = None
        self.slices = 0
        """Slices published at the last successful reconcile."""
        self.writes: Counter[str] = Counter()
        """Successful writes by verb."""
        self.errors: Counter[str] = Counter()
        """Failed API requests by status (``403``, ``unreachable``, ...)."""
        self.last_error: str | None = None

    def not_ready_reason(self) -> str | None:
        """Why the node's slices are not known to be published, or None."""
        if self.in_sync:
            return None
        return self.last_error or "slices not published yet"

    async def run(self) -> None:
        """Publish until cancelled."""
        self._pool = Pool(self.driver, self.node, await self._node_uid())
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._inform)
            tg.start_soon(self._follow_devices)
            if self.ledger is not None:
                tg.start_soon(self._follow_ledger, self.ledger)
            tg.start_soon(self._reconcile_loop)

    def _mark(self) -> None:
        self.in_sync = False
        self._dirty.bump()

    # -- the node ---------------------------------------------------------------------------

    async def _node_uid(self) -> str:
        """The Node's UID (the slices' owner), asked until the API server gives one."""
        backoff = Backoff(initial=0.5, maximum=30.0)
        obj = f"nodes/{self.node}"
        while True:
            delay = backoff.next()
            try:
                uid = await self.kube.node_uid(self.node)
            except KubeError as exc:
                self._failed(exc, verb="get", obj=obj)
            except Exception as exc:
                self._unexpected(exc, step=f"get {obj}", retry_in=delay)
            else:
                if uid:
                    return uid
                self.last_error = f"get {obj}: the Node has no UID"
                self._log.warning("node_uid_missing", object=obj, retry_in=round(delay, 3))
            await anyio.sleep(delay)

    # -- informer ---------------------------------------------------------------------------

    async def _inform(self) -> None:
        backoff = Backoff(initial=0.2, maximum=30.0)
        while True:
            try:
                items, version = await self.kube.list_slices(self.driver, self.node)
                self._cache = {s["metadata"]["name"]: s for s in items}
                self._mark()
                backoff.reset()
                async for kind, obj in self.kube.watch_slices(self.driver, self.node, version):
                    self._observe(kind, obj)
            except KubeError as exc:
                if exc.status != 410:  # 410: the watch fell behind; listing again is the cure
                    self._failed(exc, verb="watch", obj="resourceslices")
            except Exception as exc:  # a bad object from the server, a bug: list and watch again
                delay = backoff.next()
                self._unexpected(exc, step="list and watch resourceslices", retry_in=delay)
                await anyio.sleep(delay)
                continue
            await anyio.sleep(backoff.next())

    def _observe(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name")
        if not name or kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        known = self._cache.get(name)
        if known is not None and _older(obj, known):
            return  # our own write already told us more
        if kind == "DELETED":
            self._cache.pop(name, None)
            self._settle = True
            self._log.info("resourceslice_deleted", slice=name)
        else:
            self._cache[name] = obj
        self._mark()

    # -- reconciler -------------------------------------------------------------------------

    async def _follow_devices(self) -> None:
        version = 0
        while True:
            snapshot = await self.inventory.newer_than(version)
            version = snapshot.version
            self._mark()

    async def _follow_ledger(self, ledger: Ledger) -> None:
        version = 0
        while True:
            await ledger.plugin_changes.newer_than(version)
            version = ledger.plugin_changes.version
            self._mark()

    async def _reconcile_loop(self) -> None:
        backoff = Backoff(initial=0.1, maximum=30.0)
        seen = 0
        while True:
            with anyio.move_on_after(RESYNC):
                await self._dirty.newer_than(seen)
            if self._settle:
                # Deletions come in bursts (the kubelet's DeleteCollection at its start): let the
                # burst arrive, then write the pool once, at one new generation.
                self._settle = False
                await anyio.sleep(SETTLE)
            seen = self._dirty.version
            snapshot = self.inventory.current
            if not snapshot.complete:
                continue  # a plugin has not listed its devices yet: publish nothing partial
            if self.ledger is not None and not self.ledger.ready:
                continue  # the holders of the other API are not known yet: offer nothing
            try:
                await self._reconcile(snapshot)
            except Exception as exc:
                # A KubeError is logged where it happened (api_error); anything else (an answer
                # that is not what was expected, a bug) here, once, and retried the same way.
                delay = backoff.next()
                if not _api_errors_only(exc):
                    self._unexpected(exc, step="reconcile resourceslices", retry_in=delay)
                self.in_sync = False
                await anyio.sleep(delay)
                self._dirty.bump()
                continue
            backoff.reset()

    def _wanted(self, snapshot: Snapshot) -> list[list[dict[str, Any]]]:
        """The slices' device lists for ``snapshot`` (built once per version and server mode)."""
        key = (
            snapshot.version,
            self.taints_supported,
            self.effect_none_supported,
            self.counters_supported,
            self.shares_supported,
            self.bindings_supported,
            self.partition_types_supported,
            self.lists_supported,
            self.ledger.plugin_changes.version if self.ledger is not None else 0,
        )
        if self._wanted_cache is not None and self._wanted_cache[0] == key:
            return self._wanted_cache[1]
        devices = []
        sets: list[CounterSet] = []
        partition_type = self._partition_type()
        lists = self.list_attributes and self.lists_supported
        if not lists:
            self._note_lists_left_out(snapshot)
        if self.counters_supported:
            sets, conflicts = declared_counter_sets(e.device for e in snapshot.entries)
            for name in conflicts:
                self._log.error(
                    "counter_set_conflict", counter_set=name, note="declared differently; the first kept"
                )
        by_name = {s.name: s for s in sets}
        for entry in snapshot.entries:
            if not self.taints_supported and not schedulable(entry.device):
                continue  # no taints on this server: an unhealthy device is not offered at all
            held = self.ledger.from_dra(entry.name) if self.ledger is not None else None
            if held is not None and not self.taints_supported:
                continue  # held through the device plugin, and no taint to say so: not offered
            if not self.counters_supported and entry.device.consumes_counters:
                # Offered without its counters, a partition could be allocated to one claim and
                # a partition overlapping it to another: it is not offered at all.
                continue
            if not self.bindings_supported and entry.device.binding_conditions:
                # Offered without them, a pod would be bound before the device is ready for it.
                continue
            problem = consumption_problem(entry.device, by_name)
            if problem is None and partition_type and entry.device.consumes_counters:
                problem = partition_type_problem(entry.device, partition_type, self.driver)
            if problem is not None:
                self._log.error("device_not_published", device=entry.device.id, error=problem)
                continue
            try:
                devices.append(
                    device_entry(
                        entry,
                        self.driver,
                        taint_unhealthy=self.taints_supported,
                        effect_none=self.effect_none_supported,
                        shares=self.shares_supported,
                        lists=lists,
                        held=held is not None,
                    )
                )
            except ValueError as exc:
                self._log.error("device_not_published", device=entry.device.id, error=str(exc))
        wanted = chunks(devices, [counter_set_entry(s) for s in sets])
        self._wanted_cache = (key, wanted)
        return wanted

    def _partition_type(self) -> str | None:
        """The slices' ``partitionTypeAttribute``, qualified: the first plugin's that names one
        (None where the server drops it)."""
        if not self.partition_types_supported:
            return None
        for plugin in self.inventory.plugins:
            name = plugin.dra_partition_type_attribute
            if name:
                return name if "/" in name else f"{self.driver}/{name}"
        return None

    async def _reconcile(self, snapshot: Snapshot) -> None:
        assert self._pool is not None
        self._pool.partition_type_attribute = self._partition_type()
        todo = plan(self._pool, self._wanted(snapshot), list(self._cache.values()), self._generation)
        if not todo:
            self._synced()
            return
        started = time.monotonic()
        await self._execute(todo)
        self._generation = max(self._generation, todo.generation)
        self._log.info(
            "resourceslices_published",
            generation=todo.generation,
            created=len(todo.create),
            updated=len(todo.update),
            deleted=len(todo.delete),
            devices=len(snapshot.entries),
            seconds=round(time.monotonic() - started, 4),
        )
        # The cache holds every answer now: check again at once (nothing left to do, normally).
        self._dirty.bump()

    def _synced(self) -> None:
        if not self.in_sync:
            self.synced_at = time.monotonic()
        self.in_sync = True
        self.last_error = None
        self.slices = len(self._cache)

    async def _execute(self, todo: Plan) -> None:
        failures: list[KubeError] = []
        limit = anyio.Semaphore(PARALLEL_WRITES)

        async def write(verb: str, obj: dict[str, Any]) -> None:
            async with limit:
                name = obj["metadata"].get("name") or obj["metadata"].get("generateName", "") + "*"
                try:
                    if verb == "delete":
                        await self.kube.delete_slice(name)
                        self._cache.pop(name, None)
                    else:
                        call = self.kube.create_slice if verb == "create" else self.kube.replace_slice
                        stored = await call(obj)
                        self._cache[stored["metadata"]["name"]] = stored
                        self._check_taints(obj, stored)
                        self._check_counters(obj, stored)
                        self._check_shares(obj, stored)
                        self._check_bindings(obj, stored)
                        self._check_partition_type(obj, stored)
                    self.writes[verb] += 1
                except KubeError as exc:
                    if exc.status == 404 and verb != "create":
                        # Deleted meanwhile (a wipe in progress): plan again from what is left.
                        self._cache.pop(name, None)
                        self._dirty.bump()
                        return
                    if self._effect_none_refused(exc, obj) or self._lists_refused(exc, obj):
                        return
                    failures.append(exc)
                    self._failed(exc, verb=verb, obj=f"resourceslices/{name}")

        # Obsolete slices first (a reader never sees two slices of one device), then the rest.
        for verbs in (("delete",), ("update", "create")):
            async with anyio.create_task_group() as tg:
                for verb in verbs:
                    for obj in getattr(todo, verb):
                        tg.start_soon(write, verb, obj)
        if failures:
            raise failures[0]

    def _check_taints(self, sent: dict[str, Any], stored: dict[str, Any]) -> None:
        if not self.taints_supported:
            return
        tainted = sum(1 for d in sent["spec"].get("devices") or () if d.get("taints"))
        kept = sum(1 for d in stored.get("spec", {}).get("devices") or () if d.get("taints"))
        if tainted and not kept:
            self.taints_supported = False
            self._log.warning(
                "device_taints_dropped",
                note="the API server drops device taints (DRADeviceTaints off): unhealthy devices "
                "are left out of the slices instead",
            )
            self._mark()

    def _check_counters(self, sent: dict[str, Any], stored: dict[str, Any]) -> None:
        if not self.counters_supported:
            return
        spec, kept = sent["spec"], stored.get("spec") or {}
        dropped = bool(spec.get("sharedCounters")) and not kept.get("sharedCounters")
        if not dropped and any(d.get("consumesCounters") for d in spec.get("devices") or ()):
            dropped = not any(d.get("consumesCounters") for d in kept.get("devices") or ())
        if dropped:
            self.counters_supported = False
            self._log.warning(
                "shared_counters_dropped",
                note="the API server drops shared counters (DRAPartitionableDevices off): counter "
                "sets and the devices that consume counters are left out of the slices; enable the "
                "DRAPartitionableDevices feature (on by default from Kubernetes 1.36) and restart "
                "the driver to publish them",
            )
            self._mark()

    def _check_shares(self, sent: dict[str, Any], stored: dict[str, Any]) -> None:
        if self.shares_supported and _dropped("allowMultipleAllocations", sent, stored):
            self.shares_supported = False
            self._log.warning(
                "shared_devices_dropped",
                note="the API server drops allowMultipleAllocations (DRAConsumableCapacity off): "
                "shared devices are published as ordinary ones, each allocated to one claim at a "
                "time; enable the DRAConsumableCapacity feature (on by default from Kubernetes "
                "1.36) and restart the driver to share them",
            )
            self._mark()

    def _check_bindings(self, sent: dict[str, Any], stored: dict[str, Any]) -> None:
        if self.bindings_supported and _dropped("bindingConditions", sent, stored):
            self.bindings_supported = False
            self._log.warning(
                "binding_conditions_dropped",
                note="the API server drops binding conditions (DRADeviceBindingConditions off): "
                "devices with binding conditions are left out of the slices, or pods would be "
                "bound before their devices are ready; enable the feature (on by default from "
                "Kubernetes 1.36) and restart the driver to offer them",
            )
            self._mark()

    def _check_partition_type(self, sent: dict[str, Any], stored: dict[str, Any]) -> None:
        kept = (stored.get("spec") or {}).get("partitionTypeAttribute")
        if self.partition_types_supported and sent["spec"].get("partitionTypeAttribute") and not kept:
            self.partition_types_supported = False
            self._log.info(
                "partition_type_attribute_dropped",
                note="the API server drops partitionTypeAttribute (DRAPartitionableDevicesType "
                "off, the default in Kubernetes 1.37): slices go without it; partitions are "
                "allocated as before",
            )
            self._mark()

    def _note_lists_left_out(self, snapshot: Snapshot) -> None:
        """Say once which devices' list attributes are left out (where lists are not published)."""
        if self._lists_noted:
            return
        left = {e.device.id: names for e in snapshot.entries if (names := list_attributes(e.device))}
        if left:
            self._lists_noted = True
            self._log.warning(
                "list_attributes_left_out",
                devices=left,
                note="list-valued attributes are published only with list_attributes on (an API "
                "server and scheduler with the DRAListTypeAttributes feature, alpha)"
                if self.lists_supported
                else "the API server refused list attributes (DRAListTypeAttributes off)",
            )

    def _lists_refused(self, exc: KubeError, sent: dict[str, Any]) -> bool:
        """Whether ``exc`` is a server without list attributes refusing them (it drops the
        values, then finds the attribute empty): they are left out from now on."""
        text = str(exc)
        if exc.status != 422 or not self.lists_supported or "attributes" not in text:
            return False
        if "one of" not in text and "exactly one value" not in text:
            return False
        devices = sent.get("spec", {}).get("devices") or ()
        if not any(is_list(a) for d in devices for a in (d.get("attributes") or {}).values()):
            return False
        self.lists_supported = False
        self._lists_noted = False
        self._log.error(
            "list_attributes_refused",
            error=str(exc),
            note="the API server drops list-valued attributes (DRAListTypeAttributes off): they "
            "are left out, and resource.kubernetes.io/numaNode is the first NUMA node; enable the "
            "feature on the API server and scheduler and restart the driver, or turn "
            "list_attributes off",
        )
        self._mark()
        return True

    def _effect_none_refused(self, exc: KubeError, sent: dict[str, Any]) -> bool:
        """Whether ``exc`` is a server older than 1.35 refusing taint effect ``None`` (then such
        taints are left out from now on, and the pool is planned again)."""
        if exc.status != 422 or not self.effect_none_supported or '"None"' not in str(exc):
            return False
        devices = sent.get("spec", {}).get("devices") or ()
        if not any(t.get("effect") == "None" for d in devices for t in d.get("taints") or ()):
            return False
        self.effect_none_supported = False
        self._log.warning(
            "device_taint_effect_none_refused",
            error=str(exc),
            note="the API server predates taint effect None (Kubernetes < 1.35): such taints are left out",
        )
        self._mark()
        return True

    def _unexpected(self, exc: Exception, *, step: str, retry_in: float) -> None:
        """An error that is not the API server's answer: logged with its traceback and retried
        like one, never ending the driver (prepares are served meanwhile)."""
        self.last_error = f"{step}: {type(exc).__name__}: {exc}"
        self._log.exception(
            "publisher_failed", step=step, error=f"{type(exc).__name__}: {exc}", retry_in=round(retry_in, 3)
        )

    def _failed(self, exc: KubeError, *, verb: str, obj: str) -> None:
        self.errors[exc.status_label] += 1
        self.last_error = f"{verb} {obj}: {exc.status_label} {exc}"
        self._log.warning("api_error", verb=verb, object=obj, status=exc.status_label, error=str(exc))


def _dropped(key: str, sent: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether a device of ``sent`` (a slice) has ``key`` and none of ``stored`` (the server's
    answer) kept it: the server does not know the field, or its feature is off."""
    return any(d.get(key) for d in sent["spec"].get("devices") or ()) and not any(
        d.get(key) for d in (stored.get("spec") or {}).get("devices") or ()
    )


def _api_errors_only(exc: BaseException) -> bool:
    """Whether ``exc`` is a KubeError, or a group of nothing else (already logged)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_api_errors_only(e) for e in exc.exceptions)
    return isinstance(exc, KubeError)


def _older(new: dict[str, Any], known: dict[str, Any]) -> bool:
    """Whether ``new`` is an older version of the object than ``known`` (numeric versions)."""
    try:
        return int(new["metadata"]["resourceVersion"]) < int(known["metadata"]["resourceVersion"])
    except (KeyError, ValueError, TypeError):
        return False
