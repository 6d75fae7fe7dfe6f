"""What a test asks of the fake kubelet in DRA mode: drivers, waits, and the calls the kubelet makes."""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import TYPE_CHECKING

import grpc

from devplug.errors import KubeletError
from devplug.testing._kubelet import dra_rpc as rpc
from devplug.testing._kubelet.dra_validation import (
    PREPARE,
    UNPREPARE,
    check_prepare,
    check_unprepare,
    not_registered_error,
)
from devplug.testing._kubelet.pods import PodRef

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from devplug.testing._kubelet.dra_health import DeviceKey
    from devplug.testing._kubelet.dra_manager import DraManager
    from devplug.testing._kubelet.dra_resource import (
        ClaimLike,
        ClaimResult,
        DraInstance,
        DraRegistration,
        HealthName,
    )
    from devplug.testing._kubelet.pods import PodLike, PodTable

    HealthMap = dict[DeviceKey, HealthName]


class DraActions:
    """The DRA side of :class:`FakeKubelet` (``dra=True``); see there for the behaviour.

    The kubelet's delays are attributes, so a test may shorten them on an instance:
    ``dra_call_timeout`` (45 s, each NodePrepareResources/NodeUnprepareResources call),
    ``wipe_delay`` (30 s, from a driver becoming unusable to the wipe of its slices),
    ``health_timeout`` (30 s, from a device's last report to ``Unknown``), ``health_retry``
    (5 s, from the end of a health stream to the next attempt).
    """

    dra_call_timeout: float = 45.0
    wipe_delay: float = 30.0
    health_timeout: float = 30.0
    health_retry: float = 5.0
    _dra: DraManager | None
    _pods: PodTable

    @property
    def _dra_manager(self) -> DraManager:
        if self._dra is None:
            raise RuntimeError("this FakeKubelet has no DRA mode: create it with dra=True")
        return self._dra

    # -- state ---------------------------------------------------------------------------------

    @property
    def dra_registrations(self) -> list[DraRegistration]:
        """Every DRA registration attempt, accepted or not, in order; kept across restarts."""
        return self._dra_manager.registrations

    @property
    def dra_drivers(self) -> Mapping[str, tuple[DraInstance, ...]]:
        """The registered instances of each driver, oldest first, since the last (re)start."""
        return MappingProxyType({d: tuple(i) for d, i in self._dra_manager.instances.items()})

    def dra_instance(self, driver: str) -> DraInstance:
        """The instance the kubelet would call now: the newest connected one, else the newest.

        Raises:
            KeyError: ``driver`` has no registered instance.
        """
        instance = self._dra_manager.get(driver)
        if instance is None:
            known = ", ".join(sorted(self._dra_manager.instances)) or "none"
            raise KeyError(f"{not_registered_error(driver)} (registered: {known})")
        return instance

    def usable(self, driver: str) -> bool:
        """Whether an instance of ``driver`` is connected (else its slices go after ``wipe_delay``)."""
        return self._dra_manager.usable(driver)

    @property
    def prepared_claims(self) -> Mapping[str, ClaimResult]:
        """Claims prepared through :meth:`prepare` and not unprepared since, by UID; forgotten at restart."""
        return MappingProxyType(self._dra_manager.prepared)

    def health(self, driver: str) -> HealthMap:
        """The kubelet's health of each device of ``driver`` it heard of: ``(pool, device)`` → state.

        A device not reported again within its timeout reads ``"Unknown"``; empty when the
        driver's health stream is not open (the kubelet drops the driver's entries when it ends).
        """
        return self._dra_manager.health.view(driver, time.monotonic())

    def health_messages(self, driver: str) -> dict[tuple[str, str], str]:
        """The kubelet's health message of each device of ``driver``: ``(pool, device)`` → why
        it has its health (kubelet >= 1.36 shows it in the pod's status).

        As the kubelet keeps it: cut to 1024 bytes, and empty once the device reads
        ``"Unknown"``.
        """
        return self._dra_manager.health.messages(driver, time.monotonic())

    # -- waits ---------------------------------------------------------------------------------

    async def wait_for_dra(self, predicate: Callable[[], bool], *, timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds, tested again after every change of the DRA state.

        Changes are registrations, instances added or removed, connections made or lost,
        health messages and stream ends, wipes, and prepared or unprepared claims.

        Raises:
            TimeoutError: it still does not hold after ``timeout`` seconds.
        """
        dra = self._dra_manager
        await dra.wait_until(lambda: True if predicate() else None, lambda: repr(predicate), within=timeout)

    async def wait_for_dra_attempt(
        self, predicate: Callable[[DraRegistration], bool], *, timeout: float = 5.0
    ) -> DraRegistration:
        """Wait for a DRA registration attempt matching ``predicate`` (earlier ones count).

        Raises:
            TimeoutError: naming the last attempt seen.
        """
        dra = self._dra_manager

        def check() -> DraRegistration | None:
            return next((r for r in dra.registrations if predicate(r)), None)

        def describe() -> str:
            last = repr(dra.registrations[-1]) if dra.registrations else "none"
            return f"a DRA registration attempt matching {predicate!r}; last attempt: {last}"

        return await dra.wait_until(check, describe, within=timeout)

    async def wait_for_dra_registration(
        self, driver: str, *, count: int = 1, timeout: float = 5.0
    ) -> DraRegistration:
        """Wait until ``driver`` has been accepted ``count`` times in all (restarts included).

        Raises:
            TimeoutError: naming the last attempt seen.
        """
        dra = self._dra_manager

        def check() -> DraRegistration | None:
            accepted = [r for r in dra.registrations if r.accepted and r.driver == driver]
            return accepted[count - 1] if len(accepted) >= count else None

        def describe() -> str:
            last = repr(dra.registrations[-1]) if dra.registrations else "none"
            return f"registration {count} of DRA driver {driver!r}; last attempt: {last}"

        return await dra.wait_until(check, describe, within=timeout)

    async def wait_for_usable(self, driver: str, *, timeout: float = 5.0) -> DraInstance:
        """Wait until an instance of ``driver`` is connected; return the one the kubelet would call.

        Raises:
            TimeoutError: with the driver's instances as last seen.
        """
        dra = self._dra_manager

        def check() -> DraInstance | None:
            return dra.get(driver) if dra.usable(driver) else None

        def describe() -> str:
            return (
                f"a connected instance of DRA driver {driver!r}; instances: {dra.instances.get(driver, [])}"
            )

        return await dra.wait_until(check, describe, within=timeout)

    async def wait_for_health(
        self, driver: str, predicate: Callable[[HealthMap], bool] | None = None, *, timeout: float = 5.0
    ) -> HealthMap:
        """Wait until :meth:`health` of ``driver`` matches ``predicate`` (default: any device known).

        Time counts too: a device turning ``Unknown`` after its timeout is seen when it happens.

        Raises:
            TimeoutError: with the health last seen.
        """
        dra = self._dra_manager

        def check() -> HealthMap | None:
            view = dra.health.view(driver, time.monotonic())
            return view if (predicate(view) if predicate is not None else bool(view)) else None

        def describe() -> str:
            return f"health of {driver!r} matching {predicate!r}; last seen: {self.health(driver)}"

        return await dra.wait_until(
            check, describe, within=timeout, wake=lambda: dra.health.next_expiry(driver, time.monotonic())
        )

    # -- the kubelet's calls -------------------------------------------------------------------

    def _callee(self, driver: str, method: str) -> DraInstance:
        instance = self._dra_manager.get(driver)
        if instance is None:
            raise KubeletError(f"{_wrap(method)}{not_registered_error(driver)}", "FAILED_PRECONDITION")
        return instance

    async def prepare_raw(self, driver: str, claims: Sequence[ClaimLike]) -> dict[str, ClaimResult]:
        """One NodePrepareResources call for ``claims`` (each a :class:`~devplug.dra.ClaimRef` or a
        plain ``(namespace, name, uid)``); the answer, unchecked.

        Raises:
            KubeletError: the driver is not registered (``FAILED_PRECONDITION``) or the call
                failed (the driver's status code).
        """
        instance = self._callee(driver, PREPARE)
        try:
            return await rpc.prepare(
                instance.channel, instance.service, claims, deadline=self.dra_call_timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise _wrapped(PREPARE, rpc.rpc_error(PREPARE, exc)) from None

    async def prepare(
        self, driver: str, claims: Sequence[ClaimLike], *, pod: PodLike | None = None
    ) -> dict[str, ClaimResult]:
        """NodePrepareResources as the kubelet calls it before a pod's sandbox starts; results by claim UID.

        One call for all ``claims`` of the driver (as for :meth:`prepare_raw`), on the service chosen
        at registration, with the ``dra_call_timeout`` deadline. The kubelet would skip claims
        it has prepared already; this helper always calls (tests check idempotency with it).

        With ``pod`` (``"ns/name"``, ``"name"`` in ``default``, or a :class:`PodRef` naming the
        container, else ``main``), a successful call records each claim (name, namespace, UID)
        with the driver's devices under that container, for the pod-resources API; the
        driver's devices of a claim recorded before are replaced.

        Raises:
            KubeletError: with the kubelet's text (``prepare dynamic resources: ...``): the
                driver is not registered (``FAILED_PRECONDITION``); the call failed (the
                driver's status code); the answer has an unknown claim UID, a claim's error, a
                device without pool or device name, or misses claims (``UNKNOWN``).
            ValueError: ``pod`` is not a pod's name, or a claim is not in the pod's namespace
                (a pod uses claims of its own namespace only); checked before the call.
        """
        ref = PodRef.of(pod) if pod is not None else None
        if ref is not None:
            strangers = [f"{ns}/{name}" for ns, name, _ in claims if ns != ref.namespace]
            if strangers:
                raise ValueError(
                    f"claims {', '.join(strangers)} are not in the namespace of pod {ref}: "
                    "a pod uses claims of its own namespace only"
                )
        results = await self.prepare_raw(driver, claims)
        problem = check_prepare(claims, results)
        if problem is not None:
            raise KubeletError(_wrap(PREPARE) + problem, "UNKNOWN")
        self._dra_manager.prepared.update(results)
        if ref is not None:
            self._pods.prepared(
                ref,
                driver,
                [(ns, name, uid, results[uid].devices if uid in results else ()) for ns, name, uid in claims],
            )
        self._dra_manager.changed()
        return results

    async def unprepare_raw(self, driver: str, claims: Sequence[ClaimLike]) -> dict[str, str]:
        """One NodeUnprepareResources call; each answered claim UID and its error (``""``), unchecked.

        Raises:
            KubeletError: as :meth:`prepare_raw`.
        """
        instance = self._callee(driver, UNPREPARE)
        try:
            return await rpc.unprepare(
                instance.channel, instance.service, claims, deadline=self.dra_call_timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise _wrapped(UNPREPARE, rpc.rpc_error(UNPREPARE, exc)) from None

    async def unprepare(self, driver: str, claims: Sequence[ClaimLike]) -> None:
        """NodeUnprepareResources as the kubelet calls it once a claim's last pod is gone.

        Raises:
            KubeletError: with the kubelet's text (``unprepare dynamic resources: ...``), as
                :meth:`prepare` (no device checks).
        """
        errors = await self.unprepare_raw(driver, claims)
        problem = check_unprepare(claims, errors)
        if problem is not None:
            raise KubeletError(_wrap(UNPREPARE) + problem, "UNKNOWN")
        for _, _, uid in claims:
            self._dra_manager.prepared.pop(uid, None)
        self._dra_manager.changed()


def _wrap(method: str) -> str:
    # The outer words of the kubelet's PrepareResources / UnprepareResources errors.
    return "prepare dynamic resources: " if method == PREPARE else "unprepare dynamic resources: "


def _wrapped(method: str, error: KubeletError) -> KubeletError:
    return KubeletError(_wrap(method) + str(error), error.code)
