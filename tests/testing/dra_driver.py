"""A raw DRA driver, written straight against the generated gRPC code, to exercise the fake kubelet.

Like the raw device plugin in ``conftest.py`` it uses none of devplug's runtime: the kit is
tested on the wire. Its DRA socket and its registration socket are served separately, so a test
can start, stop and delete each on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import grpc

from devplug._proto.dra.v1 import api_pb2 as v1
from devplug._proto.dra.v1 import api_pb2_grpc as v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as v1beta1
from devplug._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug._proto.drahealth.v1 import api_pb2 as health_v1
from devplug._proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]
DRIVER = "gpu.example.com"
NODE = "node-1"
# What it serves by default, advertised (kubelet 1.37 watches only an advertised health service).
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
# (pool, device, health 0/1/2, health_check_timeout_seconds)
HealthEntry = tuple[str, str, int, int]
PrepareHandler = Callable[[Any, Context], Awaitable[Any]]


class RawDraDriver:
    """One DRA driver: ``dra.sock`` under ``plugin_dir`` and a registration socket, scripted by the test."""

    def __init__(
        self,
        plugin_dir: Path,
        registry: Path,
        *,
        driver: str = DRIVER,
        services: tuple[str, ...] = SERVICES,
        serve: tuple[str, ...] = ("v1", "v1beta1", "v1alpha1-health"),
        reg_name: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.dra_socket = plugin_dir / "dra.sock"
        self.reg_socket = registry / (reg_name or f"{driver}-reg.sock")
        self.info = reg_pb.PluginInfo(
            type="DRAPlugin",
            name=driver,
            endpoint=str(self.dra_socket) if endpoint is None else endpoint,
            supported_versions=list(services),
        )
        self.serve = serve
        self.info_delay = 0.0
        self.notify_delay = 0.0
        self.prepare_delay = 0.0
        self.prepare_handler: PrepareHandler | None = None
        self.unprepare_handler: PrepareHandler | None = None
        self.health: list[HealthEntry] = [(NODE, "dev-0", 1, 0)]
        self.health_messages: dict[str, str] = {}  # device → the message sent with its health
        # What the kubelet did to us.
        self.statuses: list[tuple[bool, str]] = []
        self.info_calls = 0
        self.notify_calls = 0
        self.calls: list[tuple[str, str, list[str]]] = []  # (package version, method, claim UIDs)
        self.health_streams: list[str] = []  # the service of each stream opened
        self._version = 0
        self._end_health = False
        self._changed = anyio.Event()
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None
        plugin_dir.mkdir(parents=True, exist_ok=True)
        registry.mkdir(parents=True, exist_ok=True)

    # -- control ---------------------------------------------------------------------------------

    async def start(self) -> RawDraDriver:
        """Serve the DRA socket, then the registration socket (the order the kubelet needs)."""
        await self.start_dra()
        await self.start_registration()
        return self

    async def start_dra(self) -> None:
        self.dra_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        if "v1" in self.serve:
            v1_grpc.add_DRAPluginServicer_to_server(_Dra(self, "v1", v1), server)
        if "v1beta1" in self.serve:
            v1beta1_grpc.add_DRAPluginServicer_to_server(_Dra(self, "v1beta1", v1beta1), server)
        if "v1alpha1-health" in self.serve:
            health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                _Health(self, "v1alpha1", health_v1alpha1), server
            )
        if "v1-health" in self.serve:
            health_v1_grpc.add_DRAResourceHealthServicer_to_server(_Health(self, "v1", health_v1), server)
        server.add_insecure_port(f"unix:{self.dra_socket}")
        await server.start()
        self._dra = server

    async def start_registration(self) -> None:
        self.reg_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        reg_pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.reg_socket}")
        await server.start()
        self._reg = server

    async def stop_dra(self) -> None:
        """Stop serving the DRA socket and remove it (the kubelet's connection drops)."""
        if self._dra is not None:
            await self._dra.stop(None)
            self._dra = None
        self.dra_socket.unlink(missing_ok=True)

    async def stop_registration(self) -> None:
        """Stop serving the registration socket and remove it (the kubelet deregisters)."""
        if self._reg is not None:
            await self._reg.stop(None)
            self._reg = None
        self.reg_socket.unlink(missing_ok=True)

    async def stop(self) -> None:
        await self.stop_registration()
        await self.stop_dra()

    def set_health(self, entries: list[HealthEntry]) -> None:
        """Send ``entries`` as the full list on every open health stream."""
        self.health = entries
        self._bump()

    def resend_health(self) -> None:
        self._bump()

    def end_health_streams(self) -> None:
        self._end_health = True
        self._bump()

    async def changed(self) -> None:
        await self._changed.wait()

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = anyio.Event()


def default_devices(pb: Any, uid: str) -> list[Any]:
    return [
        pb.Device(
            request_names=["gpu"],
            pool_name=NODE,
            device_name="dev-0",
            cdi_device_ids=[f"k8s.{DRIVER}/gpu={uid}-dev-0"],
        )
    ]


class _Dra:
    def __init__(self, driver: RawDraDriver, version: str, pb: Any) -> None:
        self.d, self.version, self.pb = driver, version, pb

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        self.d.calls.append((self.version, "prepare", [c.uid for c in request.claims]))
        self.d._bump()
        await anyio.sleep(self.d.prepare_delay)
        if self.d.prepare_handler is not None:
            return await self.d.prepare_handler(request, context)
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].devices.extend(default_devices(self.pb, claim.uid))
        return response

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        self.d.calls.append((self.version, "unprepare", [c.uid for c in request.claims]))
        self.d._bump()
        if self.d.unprepare_handler is not None:
            return await self.d.unprepare_handler(request, context)
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims.get_or_create(claim.uid)
        return response


class _Health:
    def __init__(self, driver: RawDraDriver, version: str, pb: Any) -> None:
        self.d, self.version, self.pb = driver, version, pb

    async def NodeWatchResources(self, request: Any, context: Context) -> AsyncIterator[Any]:
        d = self.d
        d.health_streams.append(self.version)
        d._bump()
        sent = -1
        while not d._end_health:
            if sent != d._version:
                sent = d._version
                yield self.pb.NodeWatchResourcesResponse(
                    devices=[
                        self.pb.DeviceHealth(
                            device=self.pb.DeviceIdentifier(pool_name=pool, device_name=device),
                            health=health,
                            health_check_timeout_seconds=timeout,
                            message=d.health_messages.get(device, ""),
                        )
                        for pool, device, health, timeout in d.health
                    ]
                )
                # A change (or the end) may have come while this was suspended at the yield:
                # look again before waiting, or that change would be missed.
                continue
            await d.changed()


class _Registration:
    def __init__(self, driver: RawDraDriver) -> None:
        self.d = driver

    async def GetInfo(self, request: reg_pb.InfoRequest, context: Context) -> reg_pb.PluginInfo:
        self.d.info_calls += 1
        await anyio.sleep(self.d.info_delay)
        return self.d.info

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: Context
    ) -> reg_pb.RegistrationStatusResponse:
        self.d.notify_calls += 1
        await anyio.sleep(self.d.notify_delay)
        self.d.statuses.append((request.plugin_registered, request.error))
        self.d._bump()
        return reg_pb.RegistrationStatusResponse()
