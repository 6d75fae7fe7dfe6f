"""What a test asks of the fake kubelet: its state, waits on it, and the calls the kubelet makes."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

import grpc

from devplug.errors import KubeletError
from devplug.testing._kubelet.pods import PodDevice, PodRef
from devplug.testing._kubelet.rpc import error_from_rpc

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug.models import ContainerAllocation, Device, PluginOptions
    from devplug.testing._kubelet.devices import DeviceManager
    from devplug.testing._kubelet.pods import Pod, PodLike, PodTable
    from devplug.testing._kubelet.resource import Endpoint, Registration, ResourceView

T = TypeVar("T")

# gogo-protobuf's rendering of an empty AllocateResponse, as it appears in the kubelet's error.
_EMPTY_ALLOCATE_RESPONSE = "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"


class KubeletActions:
    """State, waits and device-plugin calls of :class:`FakeKubelet` (see there for error codes)."""

    _manager: DeviceManager
    _pods: PodTable
    pre_start_timeout: float

    # -- state ---------------------------------------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        """Every registration attempt, accepted or not, in order; kept across restarts."""
        return self._manager.registrations

    @property
    def resources(self) -> Mapping[str, ResourceView]:
        """The resources registered since the last (re)start, by name (a live, read-only mapping)."""
        return MappingProxyType(self._manager.resources)

    def resource(self, name: str) -> ResourceView:
        """The live view of resource ``name``.

        Raises:
            KeyError: ``name`` has not registered since the last (re)start.
        """
        try:
            return self._manager.resources[name]
        except KeyError:
            known = ", ".join(sorted(self._manager.resources)) or "none"
            raise KeyError(f"resource {name!r} is not registered (registered: {known})") from None

    def capacity(self, resource: str) -> int:
        """The node capacity the kubelet would report: every device, healthy or not (0 if unknown)."""
        view = self._manager.resources.get(resource)
        return view.capacity if view is not None else 0

    def allocatable(self, resource: str) -> int:
        """The allocatable count: healthy devices; 0 before the first list and after the stream ended."""
        view = self._manager.resources.get(resource)
        return view.allocatable if view is not None else 0

    # -- pods ----------------------------------------------------------------------------------

    @property
    def pods(self) -> Mapping[str, Pod]:
        """The running pods by ``namespace/name``, as the pod-resources API lists them (a live,
        read-only mapping of immutable records); kept across restarts."""
        return MappingProxyType(self._pods.pods)

    def end_pod(self, pod: PodLike) -> Pod:
        """The pod ended: it leaves the table, and the pod-resources API no longer lists it.

        Its claims stay prepared: :meth:`unprepare` them, as the kubelet does once a claim's last
        pod is gone. The container of a :class:`PodRef` is ignored: the whole pod ends.

        Returns:
            The pod as it was last listed.

        Raises:
            KeyError: the pod is not running (the message names those that are).
            ValueError: ``pod`` is not a pod's name.
        """
        ended = self._pods.end(PodRef.of(pod))
        self._manager.changed()
        return ended

    def _allocatable_devices(self) -> list[tuple[str, PodDevice]]:
        """The healthy devices of every resource, with their NUMA nodes, as the kubelet's
        GetAllocatableDevices gives them: one per device ID (the last listed wins)."""
        devices: list[tuple[str, PodDevice]] = []
        for name, view in self._manager.resources.items():
            table = {device_id: numa for device_id, _, numa in view._last}
            devices += [(name, PodDevice(i, numa)) for i, numa in table.items() if i in view._healthy]
        return devices

    # -- waits ---------------------------------------------------------------------------------

    async def wait_for_registration(
        self, resource: str, *, count: int = 1, timeout: float = 5.0
    ) -> Registration:
        """Wait until ``resource`` has been accepted ``count`` times in all (restarts included).

        Returns:
            The ``count``-th accepted registration of ``resource``.

        Raises:
            TimeoutError: naming what was seen.
        """

        def check() -> Registration | None:
            accepted = [r for r in self._manager.registrations if r.accepted and r.resource == resource]
            return accepted[count - 1] if len(accepted) >= count else None

        def describe() -> str:
            mine = [r for r in self._manager.registrations if r.resource == resource]
            last = repr(self._manager.registrations[-1]) if self._manager.registrations else "none"
            accepted = sum(r.accepted for r in mine)
            return (
                f"{count} accepted registration(s) of {resource!r}; seen {accepted} accepted of "
                f"{len(mine)}; last attempt: {last}"
            )

        return await self._manager.wait_until(check, describe, within=timeout)

    async def wait_for_attempt(
        self, predicate: Callable[[Registration], bool], *, timeout: float = 5.0
    ) -> Registration:
        """Wait for a registration attempt (accepted or not, past ones included) matching ``predicate``.

        Returns:
            The first matching attempt.

        Raises:
            TimeoutError: naming the last attempt seen.
        """

        def check() -> Registration | None:
            return next((r for r in self._manager.registrations if predicate(r)), None)

        def describe() -> str:
            last = repr(self._manager.registrations[-1]) if self._manager.registrations else "none"
            return f"a registration attempt matching {predicate!r}; last attempt: {last}"

        return await self._manager.wait_until(check, describe, within=timeout)

    async def wait_for(self, check: Callable[[], T | None], *, timeout: float | None = None) -> T:
        """Wait until ``check()`` returns something other than ``None``, and return it.

        ``check`` is called at once and again after every change the kubelet sees (a
        registration, a list, a stream's end, a restart, a pod's devices recorded or the pod
        ended): it should read the state, so that no change between two calls is missed.
        ``timeout`` ``None`` waits for ever; this is what ``devplug kubelet`` follows the
        kubelet with.

        Raises:
            TimeoutError: after ``timeout`` seconds.
        """
        return await self._manager.wait_until(check, lambda: "the condition", within=timeout)

    async def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[tuple[Device, ...]], bool] | None = None,
        *,
        timeout: float = 5.0,
    ) -> tuple[Device, ...]:
        """Wait until the current endpoint of ``resource`` has sent a list and the table matches.

        The test looks at the table as it is whenever something changes, like a kubelet
        reading its node status: a list replaced in quick succession may never be seen. Look
        at ``ResourceView.raw_lists`` for every message.

        Args:
            predicate: tested on ``ResourceView.devices``; by default any list received on the
                current connection will do.

        Returns:
            The device table that matched.

        Raises:
            TimeoutError: with the last table seen.
        """

        def check() -> tuple[Device, ...] | None:
            view = self._manager.resources.get(resource)
            if view is None or view.messages == 0:
                return None
            devices = view.devices
            return devices if predicate is None or predicate(devices) else None

        def describe() -> str:
            view = self._manager.resources.get(resource)
            wanted = "a device list" if predicate is None else f"devices matching {predicate!r}"
            seen = repr(view) if view is not None else "resource not registered"
            return f"{wanted} of {resource!r}; last seen: {seen}"

        return await self._manager.wait_until(check, describe, within=timeout)

    # -- the kubelet's calls -------------------------------------------------------------------

    def _endpoint(self, resource: str) -> Endpoint:
        view = self._manager.resources.get(resource)
        if view is None:
            raise KubeletError(
                f"resource {resource!r} is not registered with the kubelet", "FAILED_PRECONDITION"
            )
        if view._current.stopped:
            raise KubeletError(f"endpoint {view._current.path} has been stopped", "FAILED_PRECONDITION")
        return view._current

    async def get_options(self, resource: str) -> PluginOptions:
        """Call GetDevicePluginOptions on the registered endpoint of ``resource``."""
        endpoint = self._endpoint(resource)
        try:
            return await endpoint.client.get_options()
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def allocate(
        self, resource: str, device_ids: Sequence[str], *, pod: PodLike | None = None
    ) -> ContainerAllocation:
        """Allocate ``device_ids`` to one container, as the kubelet does at pod admission.

        One ContainerAllocateRequest per call; only the first container response is used.
        With ``pod`` (``"ns/name"``, ``"name"`` in ``default``, or a :class:`PodRef` naming the
        container, else ``main``), a successful call records the devices under that container
        for the pod-resources API, each with the NUMA nodes the resource's device table gives
        it now, replacing what the container had of ``resource``.

        Raises:
            KubeletError: the plugin's error, or ``UNKNOWN`` "no containers return in allocation
                response ..." when it answered with no container response.
            ValueError: ``pod`` is not a pod's name (checked before the call).
        """
        ref = PodRef.of(pod) if pod is not None else None
        responses = await self.allocate_raw(resource, [device_ids])
        if not responses:
            raise KubeletError(
                f"no containers return in allocation response {_EMPTY_ALLOCATE_RESPONSE}", "UNKNOWN"
            )
        if ref is not None:
            view = self._manager.resources.get(resource)
            table = {device_id: numa for device_id, _, numa in view._last} if view is not None else {}
            # The kubelet keeps a set of IDs: each device once.
            ids = dict.fromkeys(device_ids)
            self._pods.allocated(ref, resource, [PodDevice(i, table.get(i, ())) for i in ids])
            self._manager.changed()
        return responses[0]

    async def allocate_raw(
        self, resource: str, requests: Sequence[Sequence[str]]
    ) -> list[ContainerAllocation]:
        """Send one AllocateRequest with a container request per item of ``requests``; return every response.

        The kubelet never sends more than one; this is for checking that a plugin answers one
        response per request. Values are as the plugin sent them, not validated.
        """
        endpoint = self._endpoint(resource)
        try:
            return await endpoint.client.allocate(requests)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str] = (), size: int = 1
    ) -> list[str]:
        """Ask GetPreferredAllocation for ``size`` devices (the total, must-include ones counted).

        Returns the plugin's raw choice; the kubelet would then keep only IDs in ``available``
        and fill any shortfall itself. No container response reads as an empty choice.

        Raises:
            KubeletError: ``FAILED_PRECONDITION`` when the options do not offer the call (the
                kubelet would not make it), else the plugin's error.
        """
        endpoint = self._endpoint(resource)
        if not endpoint.options.get_preferred_allocation_available:
            raise KubeletError(
                f"{resource!r} does not advertise get_preferred_allocation_available: "
                "the kubelet would not call GetPreferredAllocation",
                "FAILED_PRECONDITION",
            )
        try:
            chosen = await endpoint.client.preferred(available, must_include, size)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return [] if chosen is None else chosen

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """Call PreStartContainer with the kubelet's 30 s deadline (``pre_start_timeout``).

        Raises:
            KubeletError: ``FAILED_PRECONDITION`` when the options do not ask for it (the kubelet
                would skip the call), else the plugin's error (``DEADLINE_EXCEEDED`` when late).
        """
        endpoint = self._endpoint(resource)
        if not endpoint.options.pre_start_required:
            raise KubeletError(
                f"{resource!r} does not advertise pre_start_required: "
                "the kubelet would not call PreStartContainer",
                "FAILED_PRECONDITION",
            )
        try:
            await endpoint.client.pre_start(device_ids, deadline=self.pre_start_timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def kill_stream(self, resource: str) -> None:
        """End the ListAndWatch stream of ``resource`` from the kubelet's side and close the connection.

        Afterwards every device is unhealthy (allocatable 0) and calls to the endpoint fail, as
        in the kubelet when a stream breaks; the plugin must register again to recover.

        Raises:
            KeyError: ``resource`` is not registered.
        """
        await self._manager.disconnect(self.resource(resource)._current)
