"""FakeKubeAPI's test helpers: what the kubelet, the scheduler and a user would do to the store.

They act on the store directly (no HTTP, no faults, no delay), and every write is a real write:
a new resourceVersion and a watch event.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from devplug.testing._kubeapi.resources import KINDS
from devplug.testing._kubeapi.scheduler import AllocationError, allocate
from devplug.testing._kubeapi.status import APIError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug.testing._kubeapi.resources import Kind
    from devplug.testing._kubeapi.store import Store

log = structlog.get_logger(__name__)

SLICES = KINDS["resourceslices"]
CLAIMS = KINDS["resourceclaims"]
NODES = KINDS["nodes"]

# A request: (name, count) or (name, [exact device names]).
ClaimRequest = tuple[str, "int | list[str]"]


class KubeAPIHelpers:
    """Synchronous helpers over the store, for test set-up and assertions."""

    _store: Store

    def __init__(self) -> None:
        # Device names a claim's requests asked for by name, by claim UID.
        self._wishes: dict[str, dict[str, list[str]]] = {}

    # -- nodes -----------------------------------------------------------------------------------

    def add_node(
        self, name: str, uid: str | None = None, *, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Create the Node ``name`` (its UID ``uid`` if given) and return it."""
        meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
        obj, _ = self._store.create(
            NODES, "", {"apiVersion": "v1", "kind": "Node", "metadata": meta}, uid=uid
        )
        return obj

    def nodes(self) -> list[dict[str, Any]]:
        """The stored Nodes (copies)."""
        return list(self._store.items(NODES))

    def delete_node(self, name: str) -> None:
        """Delete the Node and, as the garbage collector would, the slices it owns.

        Raises:
            LookupError: there is no such node.
        """
        node = self._get(NODES, "", name)
        self._store.delete(NODES, "", name)
        for s in self._store.items(SLICES):
            if any(
                ref.get("uid") == node["metadata"]["uid"]
                for ref in s["metadata"].get("ownerReferences") or []
            ):
                self._store.delete(SLICES, "", s["metadata"]["name"])

    # -- slices ----------------------------------------------------------------------------------

    def slices(self, node: str | None = None, driver: str | None = None) -> list[dict[str, Any]]:
        """The stored ResourceSlices (copies, by name), optionally of one node and/or driver."""
        return [
            s
            for s in self._store.items(SLICES)
            if (node is None or s["spec"].get("nodeName") == node)
            and (driver is None or s["spec"].get("driver") == driver)
        ]

    def wipe_slices(self, node: str, driver: str | None = None) -> int:
        """Delete the node's slices (of one driver, or all), as a starting kubelet does; returns how many."""
        doomed = self.slices(node, driver)
        for s in doomed:
            self._store.delete(SLICES, "", s["metadata"]["name"])
        log.info("slices_wiped", node=node, driver=driver, count=len(doomed))
        return len(doomed)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:  # noqa: ASYNC109 - a test's deadline
        """Return once ``predicate()`` holds, checked after every write.

        Raises:
            TimeoutError: it still does not hold after ``timeout`` seconds.
        """
        with anyio.move_on_after(timeout):
            while not predicate():
                await self._store.changed()
            return
        raise TimeoutError(f"condition not met within {timeout} s")

    async def wait_for_slices(
        self,
        node: str | None = None,
        driver: str | None = None,
        *,
        count: int | None = None,
        predicate: Callable[[list[dict[str, Any]]], bool] | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109 - a test's deadline
    ) -> list[dict[str, Any]]:
        """Wait until the slices of ``node``/``driver`` are ``count`` (default: >= 1) and pass ``predicate``.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the message shows what was there).
        """

        def done() -> bool:
            found = self.slices(node, driver)
            enough = len(found) == count if count is not None else bool(found)
            return enough and (predicate is None or predicate(found))

        try:
            await self.wait_for(done, timeout)
        except TimeoutError:
            names = [s["metadata"]["name"] for s in self.slices(node, driver)]
            raise TimeoutError(f"slices of node={node} driver={driver} after {timeout} s: {names}") from None
        return self.slices(node, driver)

    # -- claims ----------------------------------------------------------------------------------

    def add_claim(
        self,
        namespace: str,
        name: str,
        *,
        requests: Sequence[ClaimRequest] = (("gpu", 1),),
        uid: str | None = None,
        device_class: str = "gpu.example.com",
        config: list[dict[str, Any]] | None = None,
        capacity: Mapping[str, Mapping[str, str | int]] | None = None,
    ) -> dict[str, Any]:
        """Create a ResourceClaim with ExactCount requests and return it.

        Each request is ``(name, count)`` or ``(name, [device, ...])``: the latter asks for those
        devices by name (remembered by this fake for :meth:`allocate_claim`; the stored spec has
        their count). ``config`` entries (``{"requests": [...], "opaque": {...}}``) go to
        ``spec.devices.config``. ``capacity`` maps a request's name to the capacity it asks of
        each device (``{"gpu": {"memory": "4Gi"}}``: ``exactly.capacity.requests``, consumable
        capacity, KEP-5075).

        Raises:
            ValueError: ``capacity`` names a request that is not in ``requests``.
            APIError: the API server would refuse the claim, as for an amount that is not a
                quantity (400, ``quantities must match the regular expression ...``).
        """
        unknown = sorted(set(capacity or {}) - {request for request, _ in requests})
        if unknown:
            raise ValueError(f"capacity for requests that the claim does not have: {', '.join(unknown)}")
        wanted: list[dict[str, Any]] = []
        wishes: dict[str, list[str]] = {}
        for request, need in requests:
            if isinstance(need, list):
                wishes[request] = list(need)
            count = len(need) if isinstance(need, list) else need
            exactly: dict[str, Any] = {
                "deviceClassName": device_class,
                "allocationMode": "ExactCount",
                "count": count,
            }
            if capacity and request in capacity:
                exactly["capacity"] = {"requests": dict(capacity[request])}
            wanted.append({"name": request, "exactly": exactly})
        devices: dict[str, Any] = {"requests": wanted}
        if config:
            devices["config"] = copy.deepcopy(config)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": devices},
        }
        claim, _ = self._store.create(CLAIMS, namespace, body, uid=uid)
        self._wishes[claim["metadata"]["uid"]] = wishes
        return claim

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored ResourceClaim (a copy).

        Raises:
            LookupError: there is no such claim.
        """
        return self._get(CLAIMS, namespace, name)

    def claims(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored ResourceClaims (copies), of ``namespace`` or of all namespaces."""
        return list(self._store.items(CLAIMS, namespace))

    def annotate_claim(self, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        """Add ``annotations`` to the claim (as a controller's patch would) and return it.

        Raises:
            LookupError: there is no such claim.
        """
        claim = self.claim(namespace, name)
        claim["metadata"].setdefault("annotations", {}).update(annotations)
        return self._store.write(CLAIMS, claim)

    def _get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self._store.get(kind, namespace, name)
        except APIError as exc:
            raise LookupError(str(exc)) from None

    def allocate_claim(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        driver: str,
        devices: list[str] | None = None,
        count: int | None = None,
        config: list[dict[str, Any]] | None = None,
        pod_uid: str | None = None,
        pod_name: str | None = None,
    ) -> dict[str, Any]:
        """Allocate the claim as the scheduler would, reserve it for a pod, and return it.

        ``devices`` names the devices to take (split over the requests in order), ``count``
        overrides each request's count; otherwise each request gets its count (or its named
        devices) first fit. ``config`` entries become ``status.allocation.devices.config``
        (see the scheduler module). The pod is ``pod_name`` (default ``<claim>-pod``) with UID
        ``pod_uid`` (default: derived from the claim UID).

        Consumable capacity (KEP-5075): a device with ``allowMultipleAllocations: true`` is
        shared: each request that takes it gets a result with a new ``shareID`` and the
        ``consumedCapacity`` of each of its capacities (the request's ``capacity.requests``
        rounded up by the capacity's ``requestPolicy``, its default, or the whole capacity),
        and it is taken only while the shares of all claims stay within its capacities. A
        device asked for a capacity it lacks, or for more than its policy allows, is not taken.

        Raises:
            AllocationError: the scheduler could not allocate it (the message says why).
            LookupError: there is no such claim.
        """
        claim = self.claim(namespace, name)
        uid = claim["metadata"]["uid"]
        allocation = allocate(
            self._store,
            claim,
            node=node,
            driver=driver,
            devices=devices,
            count=count,
            config=config,
            wishes=self._wishes.get(uid, {}),
        )
        status = claim.setdefault("status", {})
        status["allocation"] = allocation
        status["reservedFor"] = [
            {"resource": "pods", "name": pod_name or f"{name}-pod", "uid": pod_uid or f"pod-{uid}"}
        ]
        stored = self._store.write(CLAIMS, claim)
        log.info(
            "claim_allocated",
            claim=f"{namespace}/{name}",
            node=node,
            devices=[r["device"] for r in allocation["devices"]["results"]],
        )
        return stored

    def delete_claim(self, namespace: str, name: str) -> None:
        """Delete the claim (its devices become free).

        Raises:
            LookupError: there is no such claim.
        """
        claim = self._get(CLAIMS, namespace, name)
        self._store.delete(CLAIMS, namespace, name)
        self._wishes.pop(claim["metadata"]["uid"], None)

    def replace_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """Delete the claim and create one of the same name and spec: a new UID, unallocated.

        Raises:
            LookupError: there is no such claim.
        """
        old = self._get(CLAIMS, namespace, name)
        wishes = self._wishes.get(old["metadata"]["uid"], {})
        self.delete_claim(namespace, name)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
        }
        body["spec"] = old["spec"]
        claim, _ = self._store.create(CLAIMS, namespace, body)
        self._wishes[claim["metadata"]["uid"]] = wishes
        return claim


__all__ = ["AllocationError", "KubeAPIHelpers"]
