"""The fake kubelet's device manager: each resource's endpoints, their streams, and change waits.

Both registration paths (``Register`` on kubelet.sock and the plugin watcher) end here, as
they do in the kubelet, so a resource behaves the same whichever way it arrived.

As kubelet 1.37's device manager, a resource may have several connected endpoints, one per
socket path: the newest is the one Allocate goes to, every stream's list replaces the
resource's device table, and when one ends another takes over (the devices turn unhealthy only
when the last one ends). A socket path that registers again while its connection is up is
refused ("device plugin already connected") after GetDevicePluginOptions, and that refusal
also makes the kubelet forget the connected client, so the end of its stream no longer
disconnects it: the resource keeps its devices and refuses that path until the kubelet
restarts. (Kubelets 1.26-1.36 kept one client per resource: a new registration replaced it,
and the end of the old stream could disconnect the new one, kubernetes issue 121994.)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

import anyio
import grpc
import structlog

from devplug._versioned import Versioned
from devplug.testing._kubelet.resource import Endpoint, Registration, ResourceView
from devplug.testing._kubelet.rpc import DialError, PluginClient, dial
from devplug.testing._kubelet.validation import go_rpc_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskGroup

    from devplug.models import PluginOptions

log = structlog.get_logger(__name__)

T = TypeVar("T")


class ConnectError(Exception):
    """Dialling a plugin or asking it for its options failed; the text is the kubelet's."""


class DeviceManager:
    """Resources, their endpoints and device tables, and every registration attempt."""

    def __init__(self) -> None:
        self.resources: dict[str, ResourceView] = {}
        self.registrations: list[Registration] = []
        self.task_group: TaskGroup | None = None
        self._endpoints: set[Endpoint] = set()
        self._changes = Versioned(None)

    # -- change notification ------------------------------------------------------------------

    def changed(self) -> None:
        """Wake every waiter: something they may be waiting for has changed."""
        self._changes.bump()

    async def wait_until(
        self, check: Callable[[], T | None], describe: Callable[[], str], *, within: float | None
    ) -> T:
        """Wait until ``check()`` returns something other than ``None`` and return it.

        Raises:
            TimeoutError: after ``within`` seconds (``None``: never), with ``describe()`` (what was
                seen last).
        """
        try:
            with anyio.fail_after(within):
                return await self._changes.wait_for(lambda _: check())
        except TimeoutError:
            raise TimeoutError(f"timed out after {within} s waiting for {describe()}") from None

    def record(self, registration: Registration) -> None:
        self.registrations.append(registration)
        self.changed()

    # -- endpoints ----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every resource, as a freshly started kubelet knows none."""
        self.resources = {}
        self.changed()

    async def connect(
        self, resource: str, path: str, *, options: PluginOptions | None, dial_timeout: float
    ) -> Endpoint:
        """Dial ``path``, learn its options, make it ``resource``'s endpoint and start its ListAndWatch.

        Args:
            options: the options to use (kubelet <= 1.25 takes RegisterRequest's); ``None`` to
                ask the plugin with GetDevicePluginOptions, as kubelet >= 1.26 does.

        Raises:
            ConnectError: with the kubelet's text; the resource's current endpoint is untouched.
        """
        try:
            channel = await dial(path, within=dial_timeout)
        except DialError as exc:
            raise ConnectError(f"failed to dial device plugin: {exc}") from None
        client = PluginClient(channel)
        try:
            if options is None:
                options = await client.get_options()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await client.close()
            if isinstance(exc, grpc.aio.AioRpcError):
                detail = go_rpc_error(exc.code().name, exc.details() or "")
                raise ConnectError(f"failed to get device plugin options: {detail}") from None
            raise
        endpoint = Endpoint(resource, path, client, options)
        await self._install(endpoint)
        return endpoint

    async def _install(self, endpoint: Endpoint) -> None:
        if self.task_group is None:
            # The kubelet stopped while this registration was in flight.
            await endpoint.close()
            raise ConnectError("kubelet is shutting down")
        view = self.resources.get(endpoint.resource)
        connected = view._store.get(endpoint.path) if view is not None else None
        if connected is not None:
            # The kubelet's registration server drops every client of this path on the way
            # out, the connected one included: its stream's end will not disconnect it.
            connected.orphaned = True
            with anyio.CancelScope(shield=True):
                await endpoint.close()
            log.info("plugin_already_connected", resource=endpoint.resource, socket=endpoint.path)
            raise ConnectError(f"device plugin already connected: {endpoint.path}")
        self._endpoints.add(endpoint)
        if view is None:
            view = self.resources[endpoint.resource] = ResourceView(endpoint.resource, endpoint)
        else:
            # The newest endpoint is the resource's; the others stay connected.
            view._current = endpoint
        view._store[endpoint.path] = endpoint
        self.task_group.start_soon(self._run_stream, endpoint, name=f"list_and_watch {endpoint.resource}")
        self.changed()

    async def disconnect(self, endpoint: Endpoint) -> None:
        """End ``endpoint``'s connection as the kubelet does on deregistration or a broken stream."""
        endpoint.scope.cancel()
        with anyio.move_on_after(5, shield=True):
            await endpoint.closed.wait()

    async def close_all(self) -> None:
        """Close every connection still open (kubelet shutdown)."""
        for endpoint in list(self._endpoints):
            with anyio.move_on_after(5, shield=True):
                await endpoint.close()
        self._endpoints.clear()
        self.changed()

    async def _run_stream(self, endpoint: Endpoint) -> None:
        # One ListAndWatch per connection; the kubelet never re-dials or restarts it.
        bound = log.bind(resource=endpoint.resource, socket=endpoint.path)
        try:
            with endpoint.scope:
                async for devices in endpoint.client.list_and_watch():
                    endpoint.raw_lists.append(devices)
                    endpoint.received_at.append(time.monotonic())
                    view = self.resources.get(endpoint.resource)
                    if view is not None and view._store.get(endpoint.path) is endpoint:
                        # Any endpoint's list replaces the resource's table, as each arrives.
                        view._apply(devices)
                    bound.debug(
                        "device_list_received", devices=len(devices), messages=len(endpoint.raw_lists)
                    )
                    self.changed()
                bound.info("stream_ended_by_plugin")
            if endpoint.scope.cancelled_caught:
                bound.info("stream_closed_by_kubelet")
        except grpc.aio.AioRpcError as exc:
            bound.info("stream_failed", code=exc.code().name, details=exc.details())
        except Exception:  # a stream that dies for any reason must still mark the devices
            bound.exception("stream_crashed")
        finally:
            with anyio.CancelScope(shield=True):
                view = self.resources.get(endpoint.resource)
                if view is not None and not endpoint.orphaned and view._store.get(endpoint.path) is endpoint:
                    del view._store[endpoint.path]
                    if view._store:
                        # Another endpoint of the resource takes over; the table stays as it is.
                        view._current = next(iter(view._store.values()))
                    else:
                        # The last stream ended: every device of the resource becomes unhealthy.
                        view._mark_unhealthy()
                await endpoint.close()
                self._endpoints.discard(endpoint)
                self.changed()
