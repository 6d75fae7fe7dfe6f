"""A raw device plugin, written straight against the generated gRPC code, to exercise the fake kubelet.

It deliberately uses none of devplug's runtime: the kit is tested on the wire, the way any
plugin would meet it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import lightkube
import pytest

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_pb_grpc
from devplug.testing import FakeKubeAPI, FakeKubelet
from tests.testing.dra_driver import NODE as DRA_NODE
from tests.testing.dra_driver import RawDraDriver
from tests.testing.kubeapi.real_api import kube, real_api_server  # noqa: F401  (fixtures)

Context = grpc.aio.ServicerContext[Any, Any]
RawList = list[tuple[str, str, tuple[int, ...]]]


class RawPlugin:
    """One device-plugin server on a unix socket, scripted by the test."""

    def __init__(
        self,
        socket: Path,
        resource: str = "example.com/widget",
        *,
        devices: RawList | None = None,
        pre_start_required: bool = False,
        preferred: bool = False,
        info: reg_pb.PluginInfo | None = None,
    ) -> None:
        self.socket = socket
        self.resource = resource
        self.options = pb.DevicePluginOptions(
            pre_start_required=pre_start_required, get_preferred_allocation_available=preferred
        )
        self.devices: RawList = devices if devices is not None else [("dev-0", "Healthy", ())]
        self.info = info  # set: also serve pluginregistration.Registration on this socket
        self.info_delay = 0.0
        self.notify_delay = 0.0
        self.notify_calls = 0
        self.options_error: str | None = None
        self.allocate_handler: (
            Callable[[pb.AllocateRequest, Context], Awaitable[pb.AllocateResponse]] | None
        ) = None
        self.preferred_handler: (
            Callable[[pb.PreferredAllocationRequest, Context], Awaitable[pb.PreferredAllocationResponse]]
            | None
        ) = None
        self.pre_start_delay = 0.0
        # What the kubelet did to us.
        self.options_calls = 0
        self.allocate_requests: list[list[list[str]]] = []
        self.preferred_requests: list[pb.ContainerPreferredAllocationRequest] = []
        self.pre_start_requests: list[list[str]] = []
        self.statuses: list[tuple[bool, str]] = []
        self.streams_opened = 0
        self.streams_cancelled = 0
        self.streams_closed = 0
        self._version = 0
        self._changed = anyio.Event()
        self._end_streams = False
        self._server: grpc.aio.Server | None = None

    # -- control ---------------------------------------------------------------------------------

    async def start(self) -> RawPlugin:
        self._server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(_DevicePlugin(self), self._server)
        if self.info is not None:
            reg_pb_grpc.add_RegistrationServicer_to_server(_WatcherRegistration(self), self._server)
        self._server.add_insecure_port(f"unix:{self.socket}")
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        self.socket.unlink(missing_ok=True)

    async def register(
        self,
        kubelet_socket: Path,
        *,
        version: str = "v1beta1",
        resource: str | None = None,
        endpoint: str | None = None,
        options: pb.DevicePluginOptions | None = None,
    ) -> None:
        """Call Register on the kubelet (raises grpc.aio.AioRpcError when refused)."""
        request = pb.RegisterRequest(
            version=version,
            endpoint=self.socket.name if endpoint is None else endpoint,
            resource_name=self.resource if resource is None else resource,
            options=self.options if options is None else options,
        )
        # A channel of its own subchannels: grpc shares connections between channels to one
        # target, and a kubelet restarted at the same path must not get a Register that was
        # meant for it on the old kubelet's closing connection ("Stream removed: Broken pipe").
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}", options=options) as channel:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=5)

    def set_devices(self, devices: RawList) -> None:
        self.devices = devices
        self._bump()

    def end_streams(self) -> None:
        """Make every ListAndWatch return (the plugin ending its streams)."""
        self._end_streams = True
        self._bump()

    async def changed(self) -> None:
        """Wait for the next thing the kubelet does to this plugin."""
        await self._changed.wait()

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = anyio.Event()


class _DevicePlugin:
    def __init__(self, plugin: RawPlugin) -> None:
        self.p = plugin

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Context) -> pb.DevicePluginOptions:
        self.p.options_calls += 1
        if self.p.options_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self.p.options_error)
        return self.p.options

    async def ListAndWatch(
        self, request: pb.Empty, context: Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        p = self.p
        p.streams_opened += 1
        p._bump()
        sent = -1
        try:
            while not p._end_streams:
                if sent == p._version:
                    await p.changed()
                    continue
                sent = p._version
                yield pb.ListAndWatchResponse(
                    devices=[
                        pb.Device(
                            ID=i,
                            health=h,
                            topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]),
                        )
                        for i, h, numa in p.devices
                    ]
                )
                # The yield hands the answer to grpc and resumes when grpc asks for the next
                # one: a change made meanwhile is seen by the version test above, not missed
                # by waiting for the next change.
        except BaseException:
            p.streams_cancelled += 1
            raise
        finally:
            p.streams_closed += 1
            p._bump()

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        self.p.allocate_requests.append([list(r.devices_ids) for r in request.container_requests])
        self.p._bump()
        if self.p.allocate_handler is not None:
            return await self.p.allocate_handler(request, context)
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"WIDGETS": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> pb.PreferredAllocationResponse:
        self.p.preferred_requests.extend(request.container_requests)
        if self.p.preferred_handler is not None:
            return await self.p.preferred_handler(request, context)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=sorted(r.available_deviceIDs)[: r.allocation_size]
                )
                for r in request.container_requests
            ]
        )

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> pb.PreStartContainerResponse:
        self.p.pre_start_requests.append(list(request.devices_ids))
        await anyio.sleep(self.p.pre_start_delay)
        return pb.PreStartContainerResponse()


class _WatcherRegistration:
    def __init__(self, plugin: RawPlugin) -> None:
        self.p = plugin

    async def GetInfo(self, request: reg_pb.InfoRequest, context: Context) -> reg_pb.PluginInfo:
        await anyio.sleep(self.p.info_delay)
        assert self.p.info is not None
        return self.p.info

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: Context
    ) -> reg_pb.RegistrationStatusResponse:
        self.p.notify_calls += 1
        await anyio.sleep(self.p.notify_delay)
        self.p.statuses.append((request.plugin_registered, request.error))
        self.p._bump()
        return reg_pb.RegistrationStatusResponse()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A fresh directory with a short path (unix socket paths are limited to 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="dpt-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def plugins() -> AsyncIterator[list[RawPlugin]]:
    """Plugins a test appends here are stopped at the end."""
    started: list[RawPlugin] = []
    yield started
    for plugin in started:
        await plugin.stop()


@pytest.fixture
def make_plugin(plugins: list[RawPlugin]) -> Callable[..., Awaitable[RawPlugin]]:
    """Make a RawPlugin (constructor arguments) and start it unless ``serve=False``; stopped at the end."""

    async def make(socket: Path, *args: Any, serve: bool = True, **kwargs: Any) -> RawPlugin:
        plugin = RawPlugin(socket, *args, **kwargs)
        plugins.append(plugin)
        return await plugin.start() if serve else plugin

    return make


# -- DRA: a fake API server, a fake kubelet in DRA mode, raw DRA drivers ------------------------------

MakeDraDriver = Callable[..., Awaitable[RawDraDriver]]


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    """A started FakeKubeAPI with the node ``node-1`` (a test module may define its own)."""
    async with FakeKubeAPI() as server:
        server.add_node(DRA_NODE)
        yield server


@pytest.fixture
async def client(api: FakeKubeAPI) -> AsyncIterator[lightkube.AsyncClient]:
    """A lightkube client of ``api``."""
    async with api.client() as c:
        yield c


@pytest.fixture
async def dra_api() -> AsyncIterator[FakeKubeAPI]:
    """A started FakeKubeAPI with the node ``node-1``."""
    async with FakeKubeAPI() as api:
        api.add_node(DRA_NODE)
        yield api


@pytest.fixture
async def dra_kubelet(short_dir: Path, dra_api: FakeKubeAPI) -> AsyncIterator[FakeKubelet]:
    """A started FakeKubelet in DRA mode for ``node-1`` of ``dra_api``, with directories in ``short_dir``."""
    kubelet = FakeKubelet(
        short_dir / "device-plugins",
        plugins_registry_dir=short_dir / "plugins_registry",
        dra=True,
        kube_api=dra_api,
        node_name=DRA_NODE,
    )
    async with kubelet:
        yield kubelet


@pytest.fixture
async def make_dra_driver(short_dir: Path) -> AsyncIterator[MakeDraDriver]:
    """Make a RawDraDriver under ``short_dir`` (``name`` picks its plugin directory), started unless
    ``serve_now=False``; stopped at the end."""
    started: list[RawDraDriver] = []

    async def make(name: str = "a", *, serve_now: bool = True, **kwargs: Any) -> RawDraDriver:
        driver = RawDraDriver(short_dir / "plugins" / name, short_dir / "plugins_registry", **kwargs)
        started.append(driver)
        return await driver.start() if serve_now else driver

    yield make
    for driver in started:
        await driver.stop()
