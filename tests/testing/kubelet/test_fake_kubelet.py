"""FakeKubelet against a raw plugin: Register, device lists, the kubelet's calls, stream ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.errors import KubeletError
from devplug.models import ContainerAllocation, DeviceSpec, Health, Mount, PluginOptions
from devplug.testing import FakeKubelet
from tests.support import never_within, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

    from conftest import RawPlugin

    MakePlugin = Callable[..., Awaitable[RawPlugin]]

pytestmark = pytest.mark.anyio

RESOURCE = "example.com/widget"


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[FakeKubelet]:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        yield kubelet


async def registered(kubelet: FakeKubelet, make_plugin: MakePlugin, **kwargs: Any) -> RawPlugin:
    plugin = await make_plugin(kubelet.device_plugin_dir / "widget-1.sock", RESOURCE, **kwargs)
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_devices(RESOURCE)
    return plugin


# -- Register ---------------------------------------------------------------------------------


async def test_register_is_synchronous_and_uses_get_device_plugin_options(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await make_plugin(kubelet.device_plugin_dir / "widget-1.sock", RESOURCE, preferred=True)
    # Kubelet >= 1.26 ignores RegisterRequest.options: send different ones to prove it.
    await plugin.register(kubelet.socket_path, options=pb.DevicePluginOptions(pre_start_required=True))

    # Register returned: the kubelet has already dialled back and asked for the options.
    assert plugin.options_calls == 1
    assert RESOURCE in kubelet.resources
    registration = kubelet.registrations[-1]
    assert registration.accepted
    assert registration.error is None
    assert registration.via == "register"
    assert registration.endpoint == "widget-1.sock"
    assert registration.version == "v1beta1"
    assert registration.options == PluginOptions(pre_start_required=True)
    assert await kubelet.wait_for_registration(RESOURCE) is registration

    view = kubelet.resource(RESOURCE)
    assert view.endpoint == str(kubelet.device_plugin_dir / "widget-1.sock")
    assert view.options == PluginOptions(get_preferred_allocation_available=True)
    devices = await kubelet.wait_for_devices(RESOURCE)
    assert [(d.id, d.health) for d in devices] == [("dev-0", Health.HEALTHY)]
    assert view.connected
    assert plugin.streams_opened == 1
    assert await kubelet.get_options(RESOURCE) == view.options


async def test_bad_version_is_refused_with_the_kubelet_text(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await make_plugin(kubelet.device_plugin_dir / "widget-1.sock", RESOURCE)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(kubelet.socket_path, version="v1alpha")
    assert caught.value.code() is grpc.StatusCode.UNKNOWN
    assert caught.value.details() == (
        'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]'
    )
    attempt = kubelet.registrations[-1]
    assert not attempt.accepted
    assert attempt.error == caught.value.details()
    assert plugin.options_calls == 0
    assert RESOURCE not in kubelet.resources


@pytest.mark.parametrize(
    "name", ["widget", "kubernetes.io/widget", "requests.example.com/w", "Example.com/w"]
)
async def test_bad_resource_name_is_refused(kubelet: FakeKubelet, make_plugin: MakePlugin, name: str) -> None:
    plugin = await make_plugin(kubelet.device_plugin_dir / "widget-1.sock", name)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(kubelet.socket_path)
    assert caught.value.code() is grpc.StatusCode.UNKNOWN
    assert caught.value.details() == f'the ResourceName "{name}" is invalid'
    assert kubelet.registrations[-1].resource == name
    with pytest.raises(TimeoutError, match="accepted registration"):
        await kubelet.wait_for_registration(name, timeout=0.05)


async def test_register_fails_when_the_plugin_cannot_be_dialled(kubelet: FakeKubelet) -> None:
    kubelet.dial_timeout = 0.2
    request = pb.RegisterRequest(version="v1beta1", endpoint="absent.sock", resource_name=RESOURCE)
    async with grpc.aio.insecure_channel(f"unix:{kubelet.socket_path}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "failed to dial device plugin: context deadline exceeded"
    assert not kubelet.registrations[-1].accepted


async def test_register_fails_when_get_device_plugin_options_fails(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await make_plugin(kubelet.device_plugin_dir / "widget-1.sock", RESOURCE)
    plugin.options_error = "no options today"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(kubelet.socket_path)
    assert caught.value.code() is grpc.StatusCode.UNKNOWN
    assert caught.value.details() == (
        "failed to get device plugin options: rpc error: code = Internal desc = no options today"
    )
    assert RESOURCE not in kubelet.resources


async def test_kubelet_125_answers_at_once_and_trusts_register_options(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    async with FakeKubelet(short_dir / "dp", sync_register=False) as kubelet:
        socket = kubelet.device_plugin_dir / "widget-1.sock"
        plugin = await make_plugin(socket, RESOURCE, pre_start_required=True, serve=False)
        # Not serving yet: a 1.25 kubelet accepts anyway and dials in the background.
        await plugin.register(kubelet.socket_path)
        assert kubelet.registrations[-1].accepted
        assert RESOURCE not in kubelet.resources
        await plugin.start()
        await kubelet.wait_for_devices(RESOURCE)
        assert kubelet.resource(RESOURCE).options == PluginOptions(pre_start_required=True)
        assert plugin.options_calls == 0


async def test_a_second_endpoint_of_a_resource_takes_the_calls_and_the_first_stays(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    # Kubelet 1.37: endpoints by socket path; the newest is the resource's, the others stay
    # connected, and each stream's list replaces the table.
    first = await registered(kubelet, make_plugin)
    second = await make_plugin(
        kubelet.device_plugin_dir / "widget-2.sock",
        RESOURCE,
        devices=[("x", "Healthy", ()), ("y", "Healthy", ())],
    )
    await second.register(kubelet.socket_path)
    view = kubelet.resource(RESOURCE)
    assert view.endpoint == str(second.socket)
    assert (await kubelet.wait_for_registration(RESOURCE, count=2)).endpoint == "widget-2.sock"
    await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 2)
    assert kubelet.allocatable(RESOURCE) == 2
    assert (first.streams_opened, first.streams_closed) == (1, 0)

    # The newest goes: the first takes over, the table stays until it sends a list.
    await second.stop()
    await kubelet.wait_for(lambda: True if view.endpoint == str(first.socket) else None, timeout=5)
    assert kubelet.allocatable(RESOURCE) == 2
    first.set_devices([("a", "Healthy", ())])
    await kubelet.wait_for_devices(RESOURCE, lambda ds: [d.id for d in ds] == ["a"])

    # The last one goes: nothing stays allocatable.
    await first.stop()
    await kubelet.wait_for_devices(RESOURCE, lambda ds: all(d.health == Health.UNHEALTHY for d in ds))
    assert kubelet.allocatable(RESOURCE) == 0


async def test_a_connected_path_registering_again_is_refused_and_stays_stuck(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    # Kubelet 1.37, observed in tests/e2e/test_kubelet_observed.py: refused after
    # GetDevicePluginOptions, and the kubelet then no longer notices that connection's end.
    plugin = await registered(kubelet, make_plugin)
    path = kubelet.device_plugin_dir / "widget-1.sock"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path)
    assert refused.value.details() == f"device plugin already connected: {path}"
    assert plugin.options_calls == 2
    assert (plugin.streams_opened, plugin.streams_closed) == (1, 0)
    await plugin.stop()
    # The kubelet still counts the gone plugin's device.
    await never_within(lambda: kubelet.allocatable(RESOURCE) != 1, 0.3, what="the device uncounted")
    again = await make_plugin(path, RESOURCE)
    with pytest.raises(grpc.aio.AioRpcError) as still:
        await again.register(kubelet.socket_path)
    assert still.value.details() == f"device plugin already connected: {path}"
    # A new path works; a kubelet restart clears the stuck one.
    fresh = await make_plugin(kubelet.device_plugin_dir / "widget-3.sock", RESOURCE)
    await fresh.register(kubelet.socket_path)
    await kubelet.restart()
    again = await make_plugin(path, RESOURCE)
    await again.register(kubelet.socket_path)


# -- ListAndWatch -----------------------------------------------------------------------------


async def test_each_list_replaces_the_table_and_only_exact_healthy_counts(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    assert (kubelet.capacity(RESOURCE), kubelet.allocatable(RESOURCE)) == (0, 0)
    plugin = await registered(kubelet, make_plugin)
    plugin.set_devices(
        [("a", "Healthy", (0,)), ("b", "healthy", ()), ("c", "Unhealthy", (0, 1)), ("d", "", ())]
    )
    devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)

    assert [(d.id, d.health, d.numa_nodes) for d in devices] == [
        ("a", Health.HEALTHY, (0,)),
        ("b", Health.UNHEALTHY, ()),
        ("c", Health.UNHEALTHY, (0, 1)),
        ("d", Health.UNHEALTHY, ()),
    ]
    view = kubelet.resource(RESOURCE)
    assert view.raw_lists[-1] == [
        ("a", "Healthy", (0,)),
        ("b", "healthy", ()),
        ("c", "Unhealthy", (0, 1)),
        ("d", "", ()),
    ]
    assert view.messages == 2
    assert (kubelet.capacity(RESOURCE), kubelet.allocatable(RESOURCE)) == (4, 1)

    plugin.set_devices([("z", "Healthy", ())])
    devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: [d.id for d in ds] == ["z"])
    assert (kubelet.capacity(RESOURCE), kubelet.allocatable(RESOURCE)) == (1, 1)


async def test_stream_end_makes_every_device_unhealthy_and_is_never_redialled(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, make_plugin, devices=[("a", "Healthy", ()), ("b", "Healthy", ())])
    plugin.end_streams()
    devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: not any(d.healthy for d in ds))

    assert len(devices) == 2
    assert (kubelet.capacity(RESOURCE), kubelet.allocatable(RESOURCE)) == (2, 0)
    assert not kubelet.resource(RESOURCE).connected
    assert plugin.streams_opened == 1
    with pytest.raises(KubeletError) as caught:
        await kubelet.allocate(RESOURCE, ["a"])
    assert caught.value.code == "FAILED_PRECONDITION"
    assert "has been stopped" in str(caught.value)


async def test_kill_stream_cancels_the_plugin_stream(kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await registered(kubelet, make_plugin)
    await kubelet.kill_stream(RESOURCE)
    assert kubelet.allocatable(RESOURCE) == 0
    assert kubelet.capacity(RESOURCE) == 1
    await wait_until(lambda: plugin.streams_closed > 0)
    assert plugin.streams_cancelled == 1
    with pytest.raises(KeyError):
        await kubelet.kill_stream("example.com/other")


async def test_wait_for_devices_says_what_it_saw(kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    with pytest.raises(TimeoutError, match="resource not registered"):
        await kubelet.wait_for_devices(RESOURCE, timeout=0.05)
    await registered(kubelet, make_plugin)
    with pytest.raises(TimeoutError, match=r"dev-0:Healthy"):
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 3, timeout=0.05)


# -- the kubelet's calls ----------------------------------------------------------------------


async def test_allocate_round_trip(kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await registered(kubelet, make_plugin)

    async def full(request: pb.AllocateRequest, context: object) -> pb.AllocateResponse:
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(
                    envs={"A": "1"},
                    mounts=[pb.Mount(container_path="/c", host_path="/h", read_only=True)],
                    devices=[pb.DeviceSpec(container_path="/dev/w0", host_path="/dev/w0", permissions="rw")],
                    annotations={"k": "v"},
                    cdi_devices=[pb.CDIDevice(name="example.com/widget=w0")],
                )
            ]
        )

    plugin.allocate_handler = full
    allocation = await kubelet.allocate(RESOURCE, ["dev-0"])
    assert allocation == ContainerAllocation(
        envs={"A": "1"},
        mounts=(Mount(container_path="/c", host_path="/h", read_only=True),),
        devices=(DeviceSpec.rw("/dev/w0"),),
        annotations={"k": "v"},
        cdi_devices=("example.com/widget=w0",),
    )
    assert plugin.allocate_requests == [[["dev-0"]]]


async def test_allocate_raw_sends_several_container_requests(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, make_plugin)
    responses = await kubelet.allocate_raw(RESOURCE, [["a"], ["b", "c"]])
    assert [r.envs for r in responses] == [{"WIDGETS": "a"}, {"WIDGETS": "b,c"}]
    assert plugin.allocate_requests == [[["a"], ["b", "c"]]]


async def test_allocate_errors_carry_the_plugin_status(kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await registered(kubelet, make_plugin)

    async def refuse(
        request: pb.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AllocateResponse:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown device nope")

    plugin.allocate_handler = refuse
    with pytest.raises(KubeletError) as caught:
        await kubelet.allocate(RESOURCE, ["nope"])
    assert caught.value.code == "INVALID_ARGUMENT"
    assert str(caught.value) == "unknown device nope"


async def test_allocate_without_container_response_fails(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, make_plugin)

    async def empty(request: pb.AllocateRequest, context: object) -> pb.AllocateResponse:
        return pb.AllocateResponse()

    plugin.allocate_handler = empty
    with pytest.raises(KubeletError, match=r"^no containers return in allocation response") as caught:
        await kubelet.allocate(RESOURCE, ["dev-0"])
    assert caught.value.code == "UNKNOWN"


async def test_calls_to_unregistered_resources_fail(kubelet: FakeKubelet) -> None:
    with pytest.raises(KubeletError) as caught:
        await kubelet.allocate(RESOURCE, ["dev-0"])
    assert caught.value.code == "FAILED_PRECONDITION"
    with pytest.raises(KeyError, match="not registered"):
        kubelet.resource(RESOURCE)


async def test_preferred_allocation_only_when_offered(kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await registered(kubelet, make_plugin)
    with pytest.raises(KubeletError) as caught:
        await kubelet.preferred_allocation(RESOURCE, ["a", "b"])
    assert caught.value.code == "FAILED_PRECONDITION"
    assert plugin.preferred_requests == []


async def test_preferred_allocation_round_trip_and_errors(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, make_plugin, preferred=True)
    assert await kubelet.preferred_allocation(RESOURCE, ["c", "b", "a"], ["b"], 2) == ["a", "b"]
    (request,) = plugin.preferred_requests
    assert list(request.available_deviceIDs) == ["c", "b", "a"]
    assert list(request.must_include_deviceIDs) == ["b"]
    assert request.allocation_size == 2

    async def fail(
        request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "policy exploded")

    plugin.preferred_handler = fail
    with pytest.raises(KubeletError) as caught:
        await kubelet.preferred_allocation(RESOURCE, ["a"])
    assert (caught.value.code, str(caught.value)) == ("INTERNAL", "policy exploded")


async def test_pre_start_only_when_required_and_with_a_deadline(
    kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, make_plugin)
    with pytest.raises(KubeletError) as caught:
        await kubelet.pre_start(RESOURCE, ["dev-0"])
    assert caught.value.code == "FAILED_PRECONDITION"

    await plugin.stop()
    plugin = await registered(kubelet, make_plugin, pre_start_required=True)
    await kubelet.pre_start(RESOURCE, ["dev-0"])
    assert plugin.pre_start_requests == [["dev-0"]]

    plugin.pre_start_delay = 2
    kubelet.pre_start_timeout = 0.1
    with pytest.raises(KubeletError) as caught:
        await kubelet.pre_start(RESOURCE, ["dev-0"])
    assert caught.value.code == "DEADLINE_EXCEEDED"
