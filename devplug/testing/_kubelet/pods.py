"""The fake kubelet's pods: which container holds which devices, as its pod-resources API lists them.

The kubelet learns its pods from the API server and records what its device manager
(``Allocate``) and DRA manager (``NodePrepareResources``) gave each container. The fake has no
pods of its own: a test names the pod in the call that gives it devices
(``allocate(..., pod=...)``, ``prepare(..., pod=...)``), and :meth:`PodTable.end` takes it out.
Plain records, no I/O; the table outlives kubelet restarts, as running containers do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug.testing._kubelet.dra_resource import ClaimDevice

DEFAULT_NAMESPACE = "default"
DEFAULT_CONTAINER = "main"


@dataclass(frozen=True)
class PodRef:
    """A pod's container, as a test names it to the fake kubelet: ``PodRef("ml", "train")``.

    Where a plain string is taken instead, ``"ns/name"`` names the pod ``name`` of namespace
    ``ns`` and ``"name"`` the pod ``name`` of ``default``, both with the container ``main``.
    ``str()`` gives ``namespace/name``.
    """

    namespace: str
    name: str
    container: str = DEFAULT_CONTAINER

    def __post_init__(self) -> None:
        parts = (("namespace", self.namespace), ("name", self.name), ("container", self.container))
        for what, value in parts:
            if not isinstance(value, str) or not value:
                raise ValueError(f"a pod's {what} must be a non-empty string, not {value!r}")
        if "/" in self.namespace or "/" in self.name:
            raise ValueError(f"a pod's namespace and name contain no '/': {self.namespace!r}, {self.name!r}")

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, pod: PodLike) -> PodRef:
        """``pod`` itself, or the container ``main`` of the pod named ``"ns/name"`` or ``"name"``.

        Raises:
            ValueError: an empty part, or more than one ``/``.
            TypeError: neither a string nor a :class:`PodRef`.
        """
        if isinstance(pod, PodRef):
            return pod
        if not isinstance(pod, str):
            raise TypeError(f"a pod is named by 'namespace/name', 'name' or a PodRef, not {pod!r}")
        parts = pod.split("/")
        if len(parts) == 1:
            return cls(DEFAULT_NAMESPACE, pod)
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ValueError(f"a pod is named 'namespace/name' or 'name', not {pod!r}")


PodLike = str | PodRef
"""A pod as the fake kubelet's calls take it: ``"ns/name"``, ``"name"`` (in ``default``), or a
:class:`PodRef` (which also names the container)."""


@dataclass(frozen=True)
class PodDevice:
    """A device a device plugin's Allocate gave a container, with its NUMA nodes.

    The NUMA nodes are those of the device in the resource's device table when it was
    allocated (the kubelet keeps them with the allocation, in its checkpoint).
    """

    id: str
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class PodClaim:
    """A DRA claim a container uses, with the devices each driver prepared for it."""

    namespace: str
    name: str
    uid: str
    drivers: Mapping[str, tuple[ClaimDevice, ...]] = field(default_factory=dict)
    """The driver's answer to NodePrepareResources for the claim, by driver, in the order
    prepared; a driver preparing the claim again replaces its devices."""


@dataclass(frozen=True)
class PodContainer:
    """What one container of a pod holds."""

    name: str
    devices: Mapping[str, tuple[PodDevice, ...]] = field(default_factory=dict)
    """Device-plugin devices by resource name; a later Allocate of the resource replaces them."""
    claims: Mapping[str, PodClaim] = field(default_factory=dict)
    """DRA claims by claim name (a pod's claims are in its namespace)."""


@dataclass(frozen=True)
class Pod:
    """A running pod of the fake kubelet: its containers, in the order they got devices."""

    namespace: str
    name: str
    containers: Mapping[str, PodContainer] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodTable:
    """The running pods, by ``namespace/name``; every record is replaced, never changed in place."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}

    def get(self, namespace: str, name: str) -> Pod | None:
        return self.pods.get(f"{namespace}/{name}")

    def allocated(self, ref: PodRef, resource: str, devices: Sequence[PodDevice]) -> None:
        """Record what Allocate gave ``ref``'s container for ``resource`` (replacing what it had)."""
        container = self._container(ref)
        self._put(ref, replace(container, devices={**container.devices, resource: tuple(devices)}))

    def prepared(
        self, ref: PodRef, driver: str, claims: Sequence[tuple[str, str, str, tuple[ClaimDevice, ...]]]
    ) -> None:
        """Record ``driver``'s devices of each claim ``(namespace, name, uid, devices)`` for ``ref``.

        A claim of the same name with another UID is another claim: it replaces the old one.
        """
        container = self._container(ref)
        held = dict(container.claims)
        for namespace, name, uid, devices in claims:
            known = held.get(name)
            drivers = dict(known.drivers) if known is not None and known.uid == uid else {}
            drivers[driver] = devices
            held[name] = PodClaim(namespace, name, uid, drivers)
        self._put(ref, replace(container, claims=held))

    def end(self, ref: PodRef) -> Pod:
        """Take the pod out of the table and return it.

        Raises:
            KeyError: the pod is not in the table (naming those that are).
        """
        try:
            return self.pods.pop(str(ref))
        except KeyError:
            running = ", ".join(self.pods) or "none"
            raise KeyError(f"pod {ref} is not running on the fake kubelet (running: {running})") from None

    def _container(self, ref: PodRef) -> PodContainer:
        pod = self.pods.get(str(ref))
        held = pod.containers.get(ref.container) if pod is not None else None
        return held if held is not None else PodContainer(ref.container)

    def _put(self, ref: PodRef, container: PodContainer) -> None:
        pod = self.pods.get(str(ref)) or Pod(ref.namespace, ref.name)
        self.pods[str(ref)] = replace(pod, containers={**pod.containers, container.name: container})
