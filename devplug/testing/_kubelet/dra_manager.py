"""The kubelet's DRA plugin manager (``dra_plugin_manager.go``, >= 1.34), for the fake kubelet.

Instances of each driver in the order they registered, each with a connection the kubelet
keeps up (gRPC reconnects on its own; the kubelet asks for a reconnect when a connection ends)
and a health stream reopened 5 s after it ends. A driver is *usable* while one of its
instances is connected; when it stops being usable its ResourceSlices on this node are
deleted ``wipe_delay`` seconds later, unless an instance connects in the meantime.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio
import grpc
import structlog

from devplug._versioned import Versioned
from devplug.testing._kubelet import dra_rpc as rpc
from devplug.testing._kubelet.dra_health import HealthCache
from devplug.testing._kubelet.dra_resource import DraInstance
from devplug.testing._kubelet.dra_validation import endpoint_taken_error, health_service
from devplug.testing._kubelet.validation import go_rpc_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskGroup

    from devplug.testing._kubeapi.server import FakeKubeAPI
    from devplug.testing._kubelet.dra_resource import ClaimResult, DraRegistration

log = structlog.get_logger(__name__)

T = TypeVar("T")


class DraTimeouts(Protocol):
    """Where the manager reads the kubelet's delays, at each use (tests may shorten them)."""

    wipe_delay: float
    health_timeout: float
    health_retry: float


class RegisterError(Exception):
    """``RegisterPlugin`` refused an instance; the text is the kubelet's."""


class DraManager:
    """Registered DRA instances by driver, their connections, health, and the slice wipes."""

    def __init__(self, timeouts: DraTimeouts, kube_api: FakeKubeAPI | None, node_name: str) -> None:
        self.timeouts = timeouts
        self.kube_api = kube_api
        self.node_name = node_name
        self.instances: dict[str, list[DraInstance]] = {}
        self.registrations: list[DraRegistration] = []
        self.prepared: dict[str, ClaimResult] = {}
        self.health = HealthCache(lambda: timeouts.health_timeout)
        self.task_group: TaskGroup | None = None
        self._wipes: dict[str, anyio.CancelScope] = {}
        self._changes = Versioned(None)

    # -- change notification ------------------------------------------------------------------

    def changed(self) -> None:
        """Wake every waiter: something they may be waiting for has changed."""
        self._changes.bump()

    async def wait_until(
        self,
        check: Callable[[], T | None],
        describe: Callable[[], str],
        *,
        within: float,
        wake: Callable[[], float | None] = lambda: None,
    ) -> T:
        """Wait until ``check()`` returns something other than ``None`` and return it.

        ``wake()`` says within how many seconds the answer may change without an event (a
        device's health expiring), so ``check`` is run again then.

        Raises:
            TimeoutError: after ``within`` seconds, with ``describe()``.
        """
        try:
            with anyio.fail_after(within):
                while True:
                    version = self._changes.version
                    result = check()
                    if result is not None:
                        return result
                    delay = wake()
                    with anyio.move_on_after(delay + 0.001 if delay is not None else None):
                        await self._changes.newer_than(version)
        except TimeoutError:
            raise TimeoutError(f"timed out after {within} s waiting for {describe()}") from None

    def record(self, registration: DraRegistration) -> None:
        self.registrations.append(registration)
        self.changed()

    # -- kubelet start and stop -----------------------------------------------------------------

    def start(self) -> None:
        """Forget instances, claims and health, and wipe the node's slices, as a starting kubelet."""
        self.instances = {}
        self.prepared = {}
        self.health.reset()
        if self.kube_api is not None:
            # The kubelet wipes in the background at start; here it is done before the plugin
            # watcher runs, so a driver that registers at once cannot lose fresh slices to it.
            self.kube_api.wipe_slices(self.node_name)
        self.changed()

    async def close_all(self) -> None:
        """Close every connection and cancel pending wipes (kubelet shutdown)."""
        for scope in self._wipes.values():
            scope.cancel()
        self._wipes.clear()
        for instances in self.instances.values():
            for instance in instances:
                instance.scope.cancel()
                instance.connected = False
                with anyio.move_on_after(5, shield=True):
                    await instance.channel.close(None)
        self.changed()

    # -- RegisterPlugin / DeRegisterPlugin ------------------------------------------------------

    def add(
        self, driver: str, endpoint: str, socket: str, services: tuple[str, ...], service: str
    ) -> DraInstance:
        """Add an instance of ``driver``, start its connection and health stream.

        Raises:
            RegisterError: the endpoint is already registered for the driver, or not absolute.
        """
        instances = self.instances.get(driver, [])
        if any(i.endpoint == endpoint for i in instances):
            raise RegisterError(endpoint_taken_error(driver, endpoint))
        if not os.path.isabs(endpoint):
            # The kubelet would dial unix:<endpoint> relative to its own working directory and
            # never connect; the fake says why at once.
            raise RegisterError(f"endpoint {endpoint!r} is not an absolute path")
        if self.task_group is None:
            raise RegisterError("kubelet is shutting down")
        instance = DraInstance(
            driver,
            endpoint,
            socket=socket,
            services=services,
            service=service,
            health_service=health_service(services),
            channel=rpc.open_channel(endpoint),
        )
        self.instances[driver] = [*instances, instance]
        self.task_group.start_soon(self._serve_instance, instance, name=f"dra_plugin {driver} {endpoint}")
        log.info("dra_plugin_registered", driver=driver, endpoint=endpoint, service=service)
        self._sync(driver)
        self.changed()
        return instance

    async def remove(self, driver: str, endpoint: str) -> None:
        """Remove the instance of ``driver`` at ``endpoint`` (its registration socket is gone)."""
        instances = self.instances.get(driver, [])
        instance = next((i for i in instances if i.endpoint == endpoint), None)
        if instance is None:
            return
        instances.remove(instance)
        if not instances:
            del self.instances[driver]
        instance.scope.cancel()
        log.info("dra_plugin_deregistered", driver=driver, endpoint=endpoint, left=len(instances))
        self._sync(driver)
        self.changed()
        with anyio.move_on_after(5, shield=True):
            await instance.channel.close(None)

    def get(self, driver: str) -> DraInstance | None:
        """The instance the kubelet calls: the newest connected one, else the newest."""
        instances = self.instances.get(driver, [])
        connected = [i for i in instances if i.connected]
        return connected[-1] if connected else (instances[-1] if instances else None)

    def usable(self, driver: str) -> bool:
        return any(i.connected for i in self.instances.get(driver, []))

    # -- background work ------------------------------------------------------------------------

    async def _serve_instance(self, instance: DraInstance) -> None:
        with instance.scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._monitor, instance)
                if instance.health_service is not None:
                    tg.start_soon(self._watch_health, instance, instance.health_service)

    async def _monitor(self, instance: DraInstance) -> None:
        # The kubelet's stats handler: ConnBegin marks the instance connected, ConnEnd
        # disconnected and asks gRPC to connect again. A Python channel that lost its
        # connection goes IDLE; asking for its state with try_to_connect is that Connect().
        channel = instance.channel
        while True:
            state = channel.get_state(try_to_connect=True)
            if state == grpc.ChannelConnectivity.SHUTDOWN:
                return
            connected = state == grpc.ChannelConnectivity.READY
            if connected != instance.connected:
                instance.connected = connected
                log.info(
                    "dra_connection_changed",
                    driver=instance.driver,
                    endpoint=instance.endpoint,
                    connected=connected,
                )
                self._sync(instance.driver)
                self.changed()
            await channel.wait_for_state_change(state)

    async def _watch_health(self, instance: DraInstance, service: str) -> None:
        bound = log.bind(driver=instance.driver, endpoint=instance.endpoint, service=service)
        while True:
            instance.health_streams += 1
            try:
                async for reports in rpc.watch_health(instance.channel, service):
                    now = time.monotonic()
                    instance.health_messages.append(reports)
                    instance.health_received_at.append(now)
                    self.health.update(instance.driver, reports, now)
                    self.changed()
                instance.health_error = "EOF"
            except grpc.aio.AioRpcError as exc:
                instance.health_error = go_rpc_error(exc.code().name, exc.details() or "")
            finally:
                # The kubelet drops what it knew of the driver whenever a stream ends.
                self.health.clear(instance.driver)
                self.changed()
            bound.info("health_stream_ended", error=instance.health_error)
            await anyio.sleep(self.timeouts.health_retry)

    def _sync(self, driver: str) -> None:
        """After any change of ``driver``'s instances: cancel its pending wipe, or schedule one."""
        if self.kube_api is None:
            return
        if self.usable(driver):
            scope = self._wipes.pop(driver, None)
            if scope is not None:
                scope.cancel()
                log.info("slice_wipe_cancelled", driver=driver)
            return
        if driver in self._wipes or self.task_group is None:
            return  # a wipe already pending keeps its original time
        scope = anyio.CancelScope()
        self._wipes[driver] = scope
        self.task_group.start_soon(self._wipe_later, driver, scope, name=f"dra_wipe {driver}")

    async def _wipe_later(self, driver: str, scope: anyio.CancelScope) -> None:
        with scope:
            await anyio.sleep(self.timeouts.wipe_delay)
            assert self.kube_api is not None
            log.info("driver_unusable_wiping_slices", driver=driver, delay=self.timeouts.wipe_delay)
            self.kube_api.wipe_slices(self.node_name, driver)
        if self._wipes.get(driver) is scope:
            del self._wipes[driver]
        self.changed()
