"""Streams, plugin sources, plugin-watcher registration, and misbehaving plugins."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import grpc
import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DevicePlugin
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.testing import FakeKubelet
from tests.support import Widgets, serving, settings_for, wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/widget"


async def test_debug_client_next_to_the_kubelet(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings) as runner:
        reg = await kubelet.wait_for_registration(RESOURCE)
        await kubelet.wait_for_devices(RESOURCE)
        seen: list[list[str]] = []
        async with grpc.aio.insecure_channel(
            f"unix://{settings.device_plugin_dir / reg.endpoint}"
        ) as channel:
            stub = pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            stream = stub.ListAndWatch(pb.Empty())
            async for message in stream:
                seen.append([d.ID for d in message.devices])
                if len(seen) == 1:
                    plugin.set_devices(plugin.devices[:2])
                else:
                    break
            stream.cancel()
        assert seen == [["w0", "w1", "w2", "w3"], ["w0", "w1"]]
        # The kubelet's own stream got the same update, unaffected by the other client.
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 2)
        # The debug client's stream ends on the plugin's side a moment after it cancels.
        await wait_until(lambda: runner.resources[RESOURCE].stats.streams == 1)


class OneShot(DevicePlugin):
    def __init__(self, name: str) -> None:
        self.resource_name = name

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        yield [Device(id=f"{self.resource_name.split('/')[1]}-0")]

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation()


class Source:
    """A plugin source the test drives: each set it is given is the new complete set."""

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Sequence[DevicePlugin]](10)

    async def watch_plugins(self) -> AsyncIterator[Sequence[DevicePlugin]]:
        async with self.receive:
            async for plugins in self.receive:
                yield plugins


async def test_resources_added_and_removed_at_run_time(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    source = Source()
    a, b = OneShot("example.com/a"), OneShot("example.com/b")
    async with FakeKubelet(settings.device_plugin_dir) as kubelet:
        await source.send.send([a])
        async with serving(source, settings) as runner:
            await kubelet.wait_for_devices("example.com/a")
            await source.send.send([a, b])
            await kubelet.wait_for_devices("example.com/b")
            first_a = kubelet.resource("example.com/a").endpoint
            await source.send.send([b])
            await wait_until(lambda: not (settings.device_plugin_dir / first_a).exists())
            assert sorted(runner.resources) == ["example.com/b"]
            # A removed resource's stream ends: the kubelet sees its devices go unhealthy.
            await kubelet.wait_for_devices("example.com/a", lambda ds: not any(d.healthy for d in ds))
            assert kubelet.allocatable("example.com/a") == 0
            await source.send.send([b, OneShot("example.com/a")])
            await kubelet.wait_for_registration("example.com/a", count=2)


async def test_plugin_watcher_mode(short_dir: Path) -> None:
    settings = settings_for(short_dir, registration="watcher")
    registry = settings.plugins_registry_dir
    async with FakeKubelet(settings.device_plugin_dir, plugins_registry_dir=registry) as kubelet:
        async with serving(Widgets(), settings) as runner:
            reg = await kubelet.wait_for_registration(RESOURCE)
            assert reg.via == "watcher" and reg.accepted
            devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
            assert all(d.healthy for d in devices)
            assert (await kubelet.allocate(RESOURCE, ["w2"])).envs == {"WIDGETS": "w2"}
            await wait_until(lambda: runner.resources[RESOURCE].stats.watcher_status is not None)
            assert runner.resources[RESOURCE].stats.watcher_status == (True, "")
            socket = runner.resources[RESOURCE].socket
            assert socket is not None and (registry / socket).is_socket()
            assert not list(settings.device_plugin_dir.glob("example.com-*"))
            # A kubelet restart needs nothing from the plugin: the socket is picked up again.
            await kubelet.restart()
            await kubelet.wait_for_registration(RESOURCE, count=2)
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
        assert not (registry / socket).exists()


async def test_plugin_watcher_mode_advertised_endpoint(short_dir: Path) -> None:
    # The process sees the registry directory at one path; the kubelet is told another one
    # (here a symlink standing in for the host path of a container mount).
    host_view = short_dir / "host-registry"
    settings = settings_for(short_dir, registration="watcher", endpoint_host_dir=host_view)
    settings.plugins_registry_dir.mkdir(parents=True)
    host_view.symlink_to(settings.plugins_registry_dir)
    async with (
        FakeKubelet(
            settings.device_plugin_dir, plugins_registry_dir=settings.plugins_registry_dir
        ) as kubelet,
        serving(Widgets(), settings),
    ):
        await kubelet.wait_for_registration(RESOURCE)
        assert kubelet.resource(RESOURCE).endpoint.startswith(str(host_view) + "/")
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)


class Flaky(Widgets):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        self.calls += 1
        yield [Device(id="f0")]
        if self.calls == 1:
            raise RuntimeError("scan failed")
        async for devices in super().watch_devices():
            yield devices


async def test_watch_devices_crash_is_logged_and_restarted(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Flaky()
    with capture_logs() as logs:
        async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
            await kubelet.wait_for_devices(RESOURCE, lambda ds: [d.id for d in ds] == ["f0"])
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
    assert plugin.calls == 2
    assert any(e["event"] == "watch_devices_failed" and e["error"] == "scan failed" for e in logs)


async def test_oversized_list_is_not_sent(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    huge = [Device(id=f"device-{i:07d}-" + "x" * 40) for i in range(80_000)]  # ~4.6 MiB on the wire
    plugin = Widgets(devices=[Device(id="small")])
    with capture_logs() as logs:
        async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
            await kubelet.wait_for_devices(RESOURCE)
            plugin.set_devices(huge)
            await wait_until(lambda: any(e["event"] == "device_list_too_large" for e in logs))
            plugin.set_devices([Device(id="after")])
            devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: [d.id for d in ds] == ["after"])
            assert len(devices) == 1
            assert all(len(lst) == 1 for lst in kubelet.resource(RESOURCE).raw_lists)  # huge never arrived
    too_large = next(e for e in logs if e["event"] == "device_list_too_large")
    assert too_large["devices"] == 80_000 and too_large["bytes"] > 4 * 1024 * 1024
