"""One process hosting both services: the device-plugin API and a DRA driver side by side."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import pytest

import devplug
from devplug import Settings
from devplug._device_plugin.runner import DevicePluginService
from devplug._dra.driver import DraService
from devplug._runtime.host import Host
from devplug.testing import FakeKubeAPI, FakeKubelet
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

NODE = "node-1"
DRIVER = "widget.example.com"


def both(root: Path, kube_api: FakeKubeAPI, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "kubelet_root": root,
        "device_plugin_dir": root / "device-plugins",
        "plugins_registry_dir": root / "plugins_registry",
        "node_name": NODE,
        "driver_name": DRIVER,
        "kubeconfig": kube_api.write_kubeconfig(root / "kubeconfig"),
        "cdi_dir": root / "cdi",
        "retry_initial": 0.02,
        "retry_max": 0.2,
        "shutdown_grace": 0.2,
        **overrides,
    }
    return Settings(**values)  # type: ignore[arg-type]


async def test_one_host_serves_both_apis_with_one_readiness_state_and_reload(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        settings = both(short_dir, api)
        old_widgets, gadgets = Widgets(), Widgets("example.com/gadget")
        new_widgets = Widgets(devices=[devplug.Device(id="w9")])
        current = [old_widgets]

        def reload() -> tuple[Settings, list[devplug.DevicePlugin]]:
            return settings, [*current, gadgets]

        host = Host(
            [DevicePluginService(old_widgets, settings), DraService([old_widgets, gadgets], settings)],
            settings,
            reload=reload,
        )
        async with FakeKubelet(
            settings.device_plugin_dir,
            plugins_registry_dir=settings.plugins_registry_dir,
            dra=True,
            kube_api=api,
            node_name=NODE,
        ) as kubelet:
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(host.run, handle_signals=False))
                with anyio.fail_after(30):
                    await host.wait_started()
                await kubelet.wait_for_devices(Widgets.resource_name, lambda ds: len(ds) == 4, timeout=10)
                await kubelet.wait_for_usable(DRIVER, timeout=10)
                await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)

                await wait_until(lambda: host.readiness()[0])
                state = host.debug_state()
                assert set(state["resources"]) == {Widgets.resource_name}  # the device-plugin side
                assert state["driver"] == DRIVER  # the DRA side
                assert [e["event"] for e in state["events"]][:1] == ["resource_added"]

                # A reload reaches both services: the device-plugin resource restarts with the
                # new object, and the DRA driver feeds the new plugin's devices.
                current[:] = [new_widgets]
                assert await host.reload()
                await kubelet.wait_for_devices(Widgets.resource_name, lambda ds: len(ds) == 1, timeout=10)

                def dra_names() -> set[str]:
                    return {
                        d["name"] for s in api.slices(node=NODE, driver=DRIVER) for d in s["spec"]["devices"]
                    }

                await api.wait_for(lambda: len(dra_names()) == 5, timeout=10)  # w9 and the four gadgets
                assert host.reloads["applied"] == 1
                assert state["events"] != host.debug_state()["events"]
                assert host.debug_state()["events"][-1]["event"] == "reloaded"
                tg.cancel_scope.cancel()


async def test_a_setting_bound_at_start_by_either_service_is_refused(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        settings = both(short_dir, api)
        widgets = Widgets()
        changed = settings.model_copy(update={"node_name": "node-2"})
        host = Host(
            [DevicePluginService(widgets, settings), DraService([widgets], settings)],
            settings,
            reload=lambda: (changed, [widgets]),
        )
        assert "node_name" in host.fixed_settings  # the DRA service's
        assert "device_plugin_dir" in host.fixed_settings  # the device-plugin service's
        assert not await host.reload()
        assert host.reloads["failed"] == 1
        assert "node_name cannot change without a restart" in str(host.history[-1]["error"])


async def test_serve_with_api_dra_serves_a_driver(short_dir: Path) -> None:
    """devplug.serve is the one entry: settings.api chooses the service."""
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        settings = both(short_dir, api, api="dra")
        (short_dir / "plugins_registry").mkdir()
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(devplug.serve, Widgets(), settings, handle_signals=False))
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)
            assert not settings.device_plugin_dir.exists()  # nothing served through the device-plugin API
            tg.cancel_scope.cancel()
