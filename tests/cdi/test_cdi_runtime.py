"""A plugin's cdi_spec hook, run by devplug against the fake kubelet."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, Health
from devplug.cdi import CdiDevice, CdiSpec, ContainerEdits
from devplug.testing import FakeKubelet
from tests.support import Widgets, never_within, serving, settings_for, wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/widget"


class CdiWidgets(Widgets):
    """Widgets that describe themselves in a CDI spec and hand out CDI names."""

    def __init__(self, *, remove: bool = False) -> None:
        super().__init__()
        self.remove_cdi_spec_on_stop = remove
        self.spec_calls = 0
        self.fail_spec = False

    def cdi_spec(self, devices: Sequence[Device]) -> CdiSpec | None:
        self.spec_calls += 1
        if self.fail_spec:
            raise RuntimeError("no spec today")
        return CdiSpec(
            kind=RESOURCE,
            devices=tuple(
                CdiDevice(name=d.id, container_edits=ContainerEdits(env=(f"WIDGET={d.id}",))) for d in devices
            ),
        )

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation(cdi_devices=tuple(f"{RESOURCE}={d.id}" for d in devices))


def spec_names(path: Path) -> list[str]:
    return [d["name"] for d in json.loads(path.read_text())["devices"]]


async def test_spec_written_before_registration_and_kept_in_step(short_dir: Path) -> None:
    settings = settings_for(short_dir, cdi_dir=short_dir / "cdi")
    path = short_dir / "cdi" / "example.com-widget.json"
    plugin = CdiWidgets()
    with capture_logs() as logs:
        async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
            await kubelet.wait_for_registration(RESOURCE)
            assert spec_names(path) == ["w0", "w1", "w2", "w3"]
            allocation = await kubelet.allocate(RESOURCE, ["w2"])
            assert allocation.cdi_devices == ("example.com/widget=w2",)
            identity = path.stat().st_ino
            # A health change alone does not change the spec: the file is left as it is.
            plugin.set_health("w1", Health.UNHEALTHY)
            await kubelet.wait_for_devices(RESOURCE, lambda ds: not ds[1].healthy)
            assert path.stat().st_ino == identity and plugin.spec_calls == 2
            # A new device reaches the spec before the kubelet sees it.
            plugin.set_devices([*plugin.devices, Device(id="w4")])
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 5)
            assert spec_names(path) == ["w0", "w1", "w2", "w3", "w4"]
    events = [e["event"] for e in logs]
    assert events.index("cdi_spec_written") < events.index("registered")
    assert events.count("cdi_spec_written") == 2
    assert path.exists()  # kept after stop unless the plugin asks


async def test_removed_on_stop_when_asked(short_dir: Path) -> None:
    settings = settings_for(short_dir, cdi_dir=short_dir / "cdi")
    path = short_dir / "cdi" / "example.com-widget.json"
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(CdiWidgets(remove=True), settings):
        await kubelet.wait_for_registration(RESOURCE)
        assert path.exists()
    assert not path.exists()


async def test_a_failing_hook_does_not_block_the_devices(short_dir: Path) -> None:
    settings = settings_for(short_dir, cdi_dir=short_dir / "cdi")
    plugin = CdiWidgets()
    plugin.fail_spec = True
    with capture_logs() as logs:
        async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
    assert "cdi_spec_failed" in [e["event"] for e in logs]
    assert not (short_dir / "cdi").exists()


async def test_an_unwritable_directory_is_logged(short_dir: Path) -> None:
    blocker = short_dir / "not-a-dir"
    blocker.write_text("")
    settings = settings_for(short_dir, cdi_dir=blocker / "cdi")
    with capture_logs() as logs:
        async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(CdiWidgets(), settings):
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
            await wait_until(lambda: any(e["event"] == "cdi_spec_write_failed" for e in logs))


async def test_plugins_without_the_hook_write_nothing(short_dir: Path) -> None:
    settings = settings_for(short_dir, cdi_dir=short_dir / "cdi")
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(Widgets(), settings):
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
        await never_within((short_dir / "cdi").exists, 0.05, what="a CDI directory")
    assert not (short_dir / "cdi").exists()
