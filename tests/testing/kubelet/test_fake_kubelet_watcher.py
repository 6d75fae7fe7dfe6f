"""FakeKubelet's plugin watcher: registration through sockets in plugins_registry/."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug.models import PluginOptions
from devplug.testing import FakeKubelet
from tests.support import wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from conftest import RawPlugin

    MakePlugin = Callable[..., Awaitable[RawPlugin]]

pytestmark = pytest.mark.anyio

RESOURCE = "example.com/widget"


def info(
    name: str = RESOURCE, *, endpoint: str = "", versions: tuple[str, ...] = ("v1beta1",)
) -> reg_pb.PluginInfo:
    return reg_pb.PluginInfo(type="DevicePlugin", name=name, endpoint=endpoint, supported_versions=versions)


async def statuses(plugin: RawPlugin, count: int = 1) -> list[tuple[bool, str]]:
    await wait_until(lambda: len(plugin.statuses) >= count)
    return plugin.statuses


def registry(kubelet: FakeKubelet) -> Path:
    assert kubelet.plugins_registry_dir is not None
    return kubelet.plugins_registry_dir


async def test_a_new_socket_registers_end_to_end(fake_kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    # One socket serves both services: an empty endpoint means "this socket".
    socket = registry(fake_kubelet) / "widget.sock"
    plugin = await make_plugin(socket, RESOURCE, info=info(), preferred=True)

    registration = await fake_kubelet.wait_for_registration(RESOURCE)
    assert registration.via == "watcher"
    assert registration.endpoint == str(socket)
    assert registration.options == PluginOptions(get_preferred_allocation_available=True)
    assert registration.version == "v1beta1"
    assert await statuses(plugin) == [(True, "")]
    devices = await fake_kubelet.wait_for_devices(RESOURCE)
    assert [d.id for d in devices] == ["dev-0"]
    assert fake_kubelet.resource(RESOURCE).endpoint == str(socket)
    assert (await fake_kubelet.allocate(RESOURCE, ["dev-0"])).envs == {"WIDGETS": "dev-0"}


async def test_sockets_present_at_start_are_picked_up(short_dir: Path, make_plugin: MakePlugin) -> None:
    (short_dir / "reg").mkdir()
    plugin = await make_plugin(short_dir / "reg" / "widget.sock", RESOURCE, info=info())
    async with FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "reg") as kubelet:
        await kubelet.wait_for_devices(RESOURCE)
        assert await statuses(plugin) == [(True, "")]
        # A restart finds it again: no re-registration needed on this path.
        await kubelet.restart()
        await kubelet.wait_for_registration(RESOURCE, count=2)
        await kubelet.wait_for_devices(RESOURCE)


async def test_a_restart_while_the_status_is_sent_still_counts_the_registration(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    """The kubelet streams devices before it sends the registration status: stopped in between,
    it has registered the plugin all the same, and the next registration is the second."""
    (short_dir / "reg").mkdir()
    socket = short_dir / "reg" / "widget.sock"
    plugin = await make_plugin(socket, RESOURCE, info=info())
    plugin.notify_delay = 30
    async with FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "reg") as kubelet:
        await kubelet.wait_for_devices(RESOURCE)
        assert kubelet.registrations == []
        await wait_until(lambda: plugin.notify_calls == 1)  # the status is being sent
        plugin.notify_delay = 0
        await kubelet.restart()
        second = await kubelet.wait_for_registration(RESOURCE, count=2)
        first = kubelet.registrations[0]
    assert first.accepted
    assert first.error == (
        f"RegisterPlugin error -- failed to send registration status at socket {socket}, "
        "err: rpc error: code = Canceled desc = context canceled"
    )
    assert (second.accepted, second.error) == (True, None)
    assert plugin.statuses == [(True, "")]


async def test_a_separate_absolute_endpoint_is_dialled(
    fake_kubelet: FakeKubelet, make_plugin: MakePlugin
) -> None:
    service = await make_plugin(fake_kubelet.device_plugin_dir / "svc.sock", RESOURCE)
    registrar = await make_plugin(
        registry(fake_kubelet) / "reg.sock", RESOURCE, info=info(endpoint=str(service.socket))
    )
    await fake_kubelet.wait_for_devices(RESOURCE)
    assert fake_kubelet.resource(RESOURCE).endpoint == str(service.socket)
    assert service.options_calls == 1
    assert registrar.options_calls == 0
    assert await statuses(registrar) == [(True, "")]


@pytest.mark.parametrize(
    ("plugin_info", "problem"),
    [
        (info("widget"), 'invalid name of device plugin socket: the ResourceName "widget" is invalid'),
        (
            info(versions=("v1alpha1", "v1")),
            "manager version, v1beta1, is not among plugin supported versions [v1alpha1 v1]",
        ),
    ],
)
async def test_invalid_plugins_are_told_why(
    fake_kubelet: FakeKubelet, make_plugin: MakePlugin, plugin_info: reg_pb.PluginInfo, problem: str
) -> None:
    plugin = await make_plugin(registry(fake_kubelet) / "widget.sock", plugin_info.name, info=plugin_info)
    ((registered, error),) = (await statuses(plugin))[:1]
    assert not registered
    assert error == f"RegisterPlugin error -- plugin validation failed with err: {problem}"
    attempt = await fake_kubelet.wait_for_attempt(lambda r: r.via == "watcher" and not r.accepted)
    assert attempt.error == error
    assert fake_kubelet.resources == {}


async def test_other_plugin_types_are_not_handled(fake_kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    csi = reg_pb.PluginInfo(type="CSIPlugin", name="csi.example.com", supported_versions=["1.0.0"])
    socket = registry(fake_kubelet) / "csi.sock"
    plugin = await make_plugin(socket, "csi.example.com", info=csi)
    ((registered, error),) = (await statuses(plugin))[:1]
    assert not registered
    assert (
        error
        == f"RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket {socket}"
    )


async def test_get_info_gets_one_second(fake_kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await make_plugin(registry(fake_kubelet) / "slow.sock", RESOURCE, info=info())
    plugin.info_delay = 1.3
    attempt = await fake_kubelet.wait_for_attempt(lambda r: r.via == "watcher", timeout=3)
    assert not attempt.accepted
    assert attempt.resource == ""
    assert attempt.error is not None
    assert "failed to get plugin info using RPC GetInfo" in attempt.error
    assert "code = DeadlineExceeded" in attempt.error
    # No status is sent when the kubelet never learnt what the plugin is.
    assert plugin.statuses == []
    assert fake_kubelet.resources == {}


async def test_a_failed_get_info_is_retried(fake_kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await make_plugin(registry(fake_kubelet) / "slow.sock", RESOURCE, info=info())
    plugin.info_delay = 1.3
    await fake_kubelet.wait_for_attempt(lambda r: not r.accepted, timeout=3)
    plugin.info_delay = 0
    await fake_kubelet.wait_for_registration(RESOURCE, timeout=3)
    assert await statuses(plugin) == [(True, "")]


async def test_deleting_the_socket_deregisters(fake_kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    plugin = await make_plugin(registry(fake_kubelet) / "widget.sock", RESOURCE, info=info())
    await fake_kubelet.wait_for_devices(RESOURCE)
    plugin.socket.unlink()
    devices = await fake_kubelet.wait_for_devices(RESOURCE, lambda ds: not any(d.healthy for d in ds))
    assert len(devices) == 1
    assert not fake_kubelet.resource(RESOURCE).connected
    assert fake_kubelet.allocatable(RESOURCE) == 0
    assert fake_kubelet.capacity(RESOURCE) == 1
    await wait_until(lambda: plugin.streams_closed > 0)


async def test_a_failed_connection_is_reported(fake_kubelet: FakeKubelet, make_plugin: MakePlugin) -> None:
    fake_kubelet.dial_timeout = 0.2
    missing = fake_kubelet.device_plugin_dir / "missing.sock"
    plugin = await make_plugin(
        registry(fake_kubelet) / "widget.sock", RESOURCE, info=info(endpoint=str(missing))
    )
    ((registered, error),) = (await statuses(plugin))[:1]
    assert not registered
    assert error == (
        "RegisterPlugin error -- plugin registration failed with err: "
        "failed to dial device plugin: context deadline exceeded"
    )
