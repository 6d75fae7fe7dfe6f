"""devplug against the fake kubelet: real gRPC over real unix sockets."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import (
    ConfigError,
    ContainerAllocation,
    Device,
    DeviceSpec,
    Health,
    KubeletError,
    PluginOptions,
    RegistrationError,
    Runner,
)
from devplug._device_plugin.registration import register
from devplug.testing import FakeKubelet
from tests.support import PickyWidgets, Widgets, never_within, serving, settings_for, wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/widget"


def all_healthy(n: int):  # type: ignore[no-untyped-def]
    return lambda devices: len(devices) == n and all(d.healthy for d in devices)


async def test_registers_and_lists_devices(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(Widgets(), settings) as runner:
        reg = await kubelet.wait_for_registration(RESOURCE)
        assert reg.accepted and reg.version == "v1beta1" and reg.via == "register"
        # A bare file name, unique per instance, that the kubelet joins under its directory.
        assert "/" not in reg.endpoint and reg.endpoint.endswith(".sock")
        assert reg.endpoint == runner.resources[RESOURCE].socket
        assert (settings.device_plugin_dir / reg.endpoint).is_socket()
        devices = await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        assert [d.id for d in devices] == ["w0", "w1", "w2", "w3"]
        assert kubelet.capacity(RESOURCE) == kubelet.allocatable(RESOURCE) == 4
        assert reg.options == PluginOptions() == await kubelet.get_options(RESOURCE)


async def test_state_at_start_is_not_a_restart(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(Widgets(), settings) as runner:
        await kubelet.wait_for_registration(RESOURCE)
        await kubelet.wait_for_devices(RESOURCE)
        # Time for a spurious restart to show itself.
        await never_within(lambda: len(kubelet.registrations) > 1, 0.3, what="a second registration")
        assert [r.accepted for r in kubelet.registrations] == [True]
        assert [reason for _, reason in runner.resources[RESOURCE].registrations] == ["start"]


async def test_options_match_in_register_and_get_options(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(PickyWidgets(), settings):
        reg = await kubelet.wait_for_registration(RESOURCE)
        expected = PluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
        assert reg.options == expected
        assert await kubelet.get_options(RESOURCE) == expected


async def test_old_kubelet_async_register(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir, sync_register=False) as kubelet:
        async with serving(PickyWidgets(), settings):
            await kubelet.wait_for_registration(RESOURCE)
            await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
            assert kubelet.resource(RESOURCE).options.pre_start_required


async def test_updates_and_health_round_trip(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        plugin.set_health("w2", Health.UNHEALTHY)
        devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: not ds[2].healthy)
        assert [d.health for d in devices] == [Health.HEALTHY] * 2 + [Health.UNHEALTHY, Health.HEALTHY]
        assert kubelet.allocatable(RESOURCE) == 3 and kubelet.capacity(RESOURCE) == 4
        plugin.set_health("w2", Health.HEALTHY)  # unhealthy is not final
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        plugin.set_devices([*plugin.devices, Device(id="w4", numa_node=1)])
        devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 5)
        assert devices[-1].numa_nodes == (1,)
        # Every message is a full list, never a delta.
        assert all(len(lst) >= 4 for lst in kubelet.resource(RESOURCE).raw_lists)
        assert {h for lst in kubelet.resource(RESOURCE).raw_lists for _, h, _ in lst} <= {
            "Healthy",
            "Unhealthy",
        }


async def test_allocate(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        allocation = await kubelet.allocate(RESOURCE, ["w3", "w1"])
        assert allocation == ContainerAllocation(
            envs={"WIDGETS": "w3,w1"},
            devices=(DeviceSpec.rw("/dev/null", "/dev/w3"), DeviceSpec.rw("/dev/null", "/dev/w1")),
            cdi_devices=("example.com/widget=w3", "example.com/widget=w1"),
        )
        results = await kubelet.allocate_raw(RESOURCE, [["w0"], ["w1", "w2"], ["w3"]])
        assert [r.envs["WIDGETS"] for r in results] == ["w0", "w1,w2", "w3"]


async def test_allocate_unknown_ids_is_invalid_argument(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        with pytest.raises(KubeletError) as info:
            await kubelet.allocate(RESOURCE, ["w0", "nope", "gone"])
        assert info.value.code == "INVALID_ARGUMENT"
        assert "nope, gone" in str(info.value)
        assert plugin.allocations == []  # the hook never saw the bad request


async def test_hook_exception_is_internal_and_process_keeps_serving(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        plugin.fail_allocate = "widget w1 is on fire"
        with capture_logs() as logs, pytest.raises(KubeletError) as info:
            await kubelet.allocate(RESOURCE, ["w1"])
        assert info.value.code == "INTERNAL" and "widget w1 is on fire" in str(info.value)
        failed = [e for e in logs if e["event"] == "allocate_failed"]
        assert failed and failed[0]["devices"] == ["w1"] and failed[0]["log_level"] == "error"
        plugin.fail_allocate = None
        assert (await kubelet.allocate(RESOURCE, ["w1"])).envs == {"WIDGETS": "w1"}


async def test_preferred_allocation_never_fails(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = PickyWidgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        avail = ["w0", "w1", "w2", "w3"]
        assert await kubelet.preferred_allocation(RESOURCE, avail, [], 2) == ["w3", "w2"]
        assert await kubelet.preferred_allocation(RESOURCE, avail, ["w0"], 2) == ["w0", "w3"]
        plugin.preferred_answer = RuntimeError("policy bug")
        assert await kubelet.preferred_allocation(RESOURCE, avail, ["w2"], 2) == ["w2", "w0"]
        plugin.preferred_answer = ["zz", "w1", "w1"]  # unknown and duplicate: repaired
        assert await kubelet.preferred_allocation(RESOURCE, avail, [], 3) == ["w1", "w0", "w2"]
        # Everything available asked for: answered without consulting the hook.
        plugin.preferred_answer = RuntimeError("must not be called")
        assert sorted(await kubelet.preferred_allocation(RESOURCE, avail, [], 4)) == avail


async def test_pre_start(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = PickyWidgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        await kubelet.pre_start(RESOURCE, ["w1", "w2"])
        assert plugin.pre_started == [["w1", "w2"]]
        with pytest.raises(KubeletError, match=r"unknown device IDs .*: x"):
            await kubelet.pre_start(RESOURCE, ["x"])


async def test_bad_resource_name_is_refused_before_register(short_dir: Path) -> None:
    """The kubelet would refuse every Register: the runner refuses at start instead of retrying."""
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet:
        with pytest.raises(ConfigError, match="plugin Widgets: 'widget' is not an extended resource name"):
            await Runner(Widgets(resource="widget"), settings).run(handle_signals=False)
        assert kubelet.registrations == []
        # What the kubelet answers such a Register, had it been sent.
        with pytest.raises(RegistrationError) as info:
            await register(kubelet.socket_path, "widget", "x.sock", PluginOptions(), 5.0)
    assert str(info.value) == 'the ResourceName "widget" is invalid'
    assert info.value.code == "UNKNOWN"


async def test_bad_version_is_rejected_with_kubelet_text(short_dir: Path) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        with pytest.raises(RegistrationError) as info:
            await register(kubelet.socket_path, RESOURCE, "x.sock", PluginOptions(), 5.0, version="v1alpha1")
    assert str(info.value) == (
        'requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]'
    )
    assert info.value.code == "UNKNOWN"


async def test_kubelet_absent_at_start(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with serving(Widgets(), settings) as runner:
        # Nothing registered, nothing served before the kubelet.
        await never_within(
            lambda: (
                runner.resources[RESOURCE].registered
                or list(settings.device_plugin_dir.glob("example.com-*"))
            ),
            2.0,
        )
        async with FakeKubelet(settings.device_plugin_dir) as kubelet:
            started = anyio.current_time()
            await kubelet.wait_for_registration(RESOURCE, timeout=2.0)
            assert anyio.current_time() - started < 1.0
            await kubelet.wait_for_devices(RESOURCE, all_healthy(4))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_hundred_kubelet_restarts(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_registration(RESOURCE)
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        await kubelet.restart()  # warm-up: grpc allocates some process-wide resources once
        await kubelet.wait_for_registration(RESOURCE, count=2)
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        fds = _open_fds()
        endpoints = set()
        for i in range(100):
            await kubelet.restart()
            reg = await kubelet.wait_for_registration(RESOURCE, count=3 + i)
            endpoints.add(reg.endpoint)
            # Each new kubelet gets a fresh, complete list, including changes made meanwhile.
            plugin.set_health("w0", Health.UNHEALTHY if i % 2 else Health.HEALTHY)
            await kubelet.wait_for_devices(
                RESOURCE, lambda ds, i=i: len(ds) == 4 and ds[0].healthy == (i % 2 == 0)
            )
        assert len(endpoints) == 100  # a new socket name every time
        accepted = [r for r in kubelet.registrations if r.resource == RESOURCE and r.accepted]
        assert len(accepted) == 102  # exactly one registration per restart: de-duplicated
        assert sorted(os.listdir(settings.device_plugin_dir)) == sorted(["kubelet.sock", reg.endpoint])
        await wait_until(lambda: _open_fds() <= fds)
        assert _open_fds() <= fds


async def test_crashed_kubelet_leaves_its_socket_behind(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(Widgets(), settings):
        await kubelet.wait_for_registration(RESOURCE)
        for count in (2, 3):
            # A dead kubelet.sock stays for a while; the new kubelet replaces it and deletes ours.
            await kubelet.restart(crash=True, downtime=0.2)
            await kubelet.wait_for_registration(RESOURCE, count=count)
            await kubelet.wait_for_devices(RESOURCE, all_healthy(4))
        await never_within(lambda: sum(r.accepted for r in kubelet.registrations) != 3, 0.2)


async def test_socket_deleted_alone_triggers_reregistration(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(Widgets(), settings):
        first = await kubelet.wait_for_registration(RESOURCE)
        os.unlink(settings.device_plugin_dir / first.endpoint)
        second = await kubelet.wait_for_registration(RESOURCE, count=2)
        assert second.endpoint != first.endpoint
        await kubelet.wait_for_devices(RESOURCE, all_healthy(4))


async def test_two_resources_in_one_process(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    a, b = Widgets("example.com/a"), Widgets("example.com/b", [Device(id="b0")])
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving([a, b], settings):
        assert len(await kubelet.wait_for_devices("example.com/a", all_healthy(4))) == 4
        assert [d.id for d in await kubelet.wait_for_devices("example.com/b")] == ["b0"]
        assert (await kubelet.allocate("example.com/b", ["b0"])).envs == {"WIDGETS": "b0"}
        await kubelet.restart()
        await kubelet.wait_for_registration("example.com/a", count=2)
        await kubelet.wait_for_registration("example.com/b", count=2)
