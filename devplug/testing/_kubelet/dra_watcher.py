"""The plugin watcher's handler for type ``DRAPlugin``: ValidatePlugin, RegisterPlugin, DeRegisterPlugin.

The watcher (:mod:`devplug.testing._kubelet.watcher`) dials the registration socket and asks GetInfo;
for a ``DRAPlugin`` it hands over here, where the steps of the kubelet's operation generator
follow: validate the service list (a failure is notified and retried with the watcher's
back-off), record the plugin as known (from here on a failure is notified, not retried), add
it to the DRA plugin manager, and notify success.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import structlog

from devplug.testing._kubelet.dra_manager import RegisterError
from devplug.testing._kubelet.dra_resource import DraRegistration
from devplug.testing._kubelet.dra_validation import validate_dra_plugin
from devplug.testing._kubelet.validation import STATUS_CUT_BY_STOP, go_rpc_error, status_not_sent_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
    from devplug.testing._kubelet.dra_manager import DraManager
    from devplug.testing._kubelet.rpc import RegistrationInfoClient

log = structlog.get_logger(__name__)

_NOTIFY_TIMEOUT = 5.0


class DraRegistrar:
    """Registers DRA plugins found by the plugin watcher with a :class:`DraManager`."""

    def __init__(self, manager: DraManager) -> None:
        self._manager = manager

    async def handshake(
        self,
        path: str,
        client: RegistrationInfoClient,
        info: reg_pb.PluginInfo,
        known: Callable[[str, str], None],
    ) -> bool:
        """Register the plugin that answered ``info`` on the registration socket ``path``.

        ``known(driver, endpoint)`` is called once the kubelet counts the plugin as known, so
        that deleting its socket deregisters ``(driver, endpoint)``: even when RegisterPlugin
        then refuses it, as the kubelet does (a refused duplicate endpoint, once its socket
        goes, deregisters the instance that holds that endpoint).

        Returns:
            ``False`` when the kubelet would try again later.
        """
        driver, services = info.name, tuple(info.supported_versions)
        endpoint = info.endpoint or path  # empty: the registration socket serves DRAPlugin too
        service, problem = validate_dra_plugin(driver, endpoint, services)
        if service is None:
            error = f"RegisterPlugin error -- plugin validation failed with err: {problem}"
            failed = await self._notify(client, path, False, error)
            self._record(
                path, driver, endpoint=endpoint, services=services, service=None, error=failed or error
            )
            return False
        known(driver, endpoint)
        try:
            self._manager.add(driver, endpoint, path, services, service)
        except RegisterError as exc:
            error = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
            failed = await self._notify(client, path, False, error)
            self._record(
                path, driver, endpoint=endpoint, services=services, service=service, error=failed or error
            )
            return True
        # Stopped while the status is on its way, the plugin was registered (and may have
        # been called) all the same: it counts as accepted, with the status unsent.
        failed = status_not_sent_error(path, STATUS_CUT_BY_STOP)
        try:
            failed = await self._notify(client, path, True, "")
        finally:
            self._record(
                path,
                driver,
                endpoint=endpoint,
                services=services,
                service=service,
                error=failed,
                accepted=True,
            )
        return True

    def failed(self, path: str, error: str) -> None:
        """Record an attempt that failed before GetInfo answered (the plugin's type unknown)."""
        self._record(path, "", endpoint="", services=(), service=None, error=error)

    async def deregister(self, driver: str, endpoint: str) -> None:
        """DeRegisterPlugin: the registration socket of ``(driver, endpoint)`` was deleted."""
        await self._manager.remove(driver, endpoint)

    async def _notify(
        self, client: RegistrationInfoClient, path: str, registered: bool, error: str
    ) -> str | None:
        try:
            await client.notify(registered, error, deadline=_NOTIFY_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            rpc = go_rpc_error(exc.code().name, exc.details() or "")
            if registered:
                return status_not_sent_error(path, rpc)
            return f"RegisterPlugin error -- failed to send error at socket {path}, err: {error}: {rpc}"
        return None

    def _record(
        self,
        path: str,
        driver: str,
        *,
        endpoint: str,
        services: tuple[str, ...],
        service: str | None,
        error: str | None,
        accepted: bool = False,
    ) -> None:
        if not accepted:
            log.info("dra_registration_failed", socket=path, driver=driver, error=error)
        self._manager.record(
            DraRegistration(
                socket=path,
                driver=driver,
                endpoint=endpoint,
                services=services,
                service=service,
                accepted=accepted,
                error=error,
            )
        )
