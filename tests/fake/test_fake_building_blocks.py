"""devplug-fake with the building blocks: --policy, --health-policy, --cdi / --cdi-dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import Device, Health, HealthSettings, KubeletError, PluginOptions, load_settings
from devplug._hooks import advertised_options
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from devplug_fake import FakePlugin, FakeResource, FakeSettings, PolicyFakePlugin
from tests.support import serving, settings_for, wait_until

RESOURCE = "example.com/fake"
H, U = Health.HEALTHY, Health.UNHEALTHY


def test_flags_reach_the_resource() -> None:
    settings = load_settings(
        FakeSettings,
        [
            "--policy",
            "numa",
            "--health-policy",
            "--health.unhealthy-after",
            "2",
            "--cdi",
            "--cdi-dir",
            "/tmp/x",
        ],
    )
    (resource,) = settings.resource_configs()
    assert resource.policy == "numa" and resource.cdi and settings.cdi_dir == Path("/tmp/x")
    assert resource.health == HealthSettings(unhealthy_after=2)
    (plain,) = load_settings(FakeSettings, []).resource_configs()
    assert plain.policy is None and plain.health is None


def test_preferred_allocation_is_offered_only_with_a_policy() -> None:
    assert type(FakePlugin(FakeResource())) is FakePlugin
    assert advertised_options(type(FakePlugin(FakeResource()))) == PluginOptions()
    plugin = FakePlugin(FakeResource(policy="packed"))
    assert isinstance(plugin, PolicyFakePlugin)
    assert advertised_options(type(plugin)) == PluginOptions(get_preferred_allocation_available=True)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("policy", "must", "size", "expected"),
    [
        ("first", [], 2, ["fake-0", "fake-1"]),
        ("packed", [], 2, ["fake-0", "fake-2"]),  # both on node 0
        ("spread", [], 2, ["fake-0", "fake-1"]),  # one per node
        ("numa", ["fake-1"], 3, ["fake-1", "fake-3", "fake-5"]),  # all of node 1
    ],
)
async def test_policies(policy: str, must: list[str], size: int, expected: list[str]) -> None:
    plugin = FakePlugin(FakeResource(count=6, numa_nodes=2, policy=policy))  # type: ignore[arg-type]
    devices = plugin.generated_devices()
    by_id = {d.id: d for d in devices}
    assert await plugin.preferred_allocation(devices, [by_id[m] for m in must], size) == expected


def write_state(path: Path, devices: list[dict[str, object]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    os.replace(tmp, path)


@pytest.mark.anyio
async def test_health_policy_on_state_file_changes(short_dir: Path) -> None:
    state = short_dir / "state" / "devices.json"
    state.parent.mkdir()
    write_state(state, [{"id": "a"}, {"id": "b"}])
    knobs = HealthSettings(unhealthy_after=2, healthy_after=1, recovery_cooldown=0, unknown_timeout=0.3)
    plugin = FakePlugin(FakeResource(state_file=state, health=knobs))
    settings = settings_for(short_dir)

    def health_is(*expected: Health):  # type: ignore[no-untyped-def]
        return lambda ds: tuple(d.health for d in ds) == expected

    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE, health_is(H, H))
        with capture_logs() as logs:
            write_state(state, [{"id": "a", "health": "Unhealthy"}, {"id": "b"}])  # one failed check
            await wait_until(lambda: any(e["event"] == "state_file_applied" for e in logs))
        assert tuple(d.health for d in kubelet.resource(RESOURCE).devices) == (H, H)
        write_state(state, [{"id": "a", "health": "Unhealthy"}, {"id": "b"}])  # the second: Unhealthy
        await kubelet.wait_for_devices(RESOURCE, health_is(U, H))
        write_state(state, [{"id": "a"}, {"id": "b"}])  # one good check recovers it
        await kubelet.wait_for_devices(RESOURCE, health_is(H, H))
        # A broken file is a check that cannot tell: unknown, Unhealthy only after the timeout.
        state.write_text("{not json")
        await kubelet.wait_for_devices(RESOURCE, health_is(U, U), timeout=5)
        assert all(lst for lst in kubelet.resource(RESOURCE).raw_lists)


@pytest.mark.anyio
async def test_cdi_spec_written_and_removed(short_dir: Path) -> None:
    settings = settings_for(short_dir, cdi_dir=short_dir / "cdi")
    spec_file = short_dir / "cdi" / "example.com-fake.json"
    async with FakeKubelet(settings.device_plugin_dir) as kubelet:
        async with serving(FakePlugin(FakeResource(count=2, cdi=True)), settings):
            await kubelet.wait_for_registration(RESOURCE)
            spec = json.loads(spec_file.read_text())
            assert spec["kind"] == RESOURCE and [d["name"] for d in spec["devices"]] == ["fake-0", "fake-1"]
            assert spec["devices"][0]["containerEdits"]["deviceNodes"][0] == {
                "path": "/dev/fake-0",
                "hostPath": "/dev/null",
                "permissions": "rw",
            }
            allocation = await kubelet.allocate(RESOURCE, ["fake-1"])
            assert allocation.cdi_devices == ("example.com/fake=fake-1",)
        assert not spec_file.exists()


@pytest.mark.anyio
async def test_cdi_skips_ids_that_are_not_cdi_names() -> None:
    plugin = FakePlugin(FakeResource(cdi=True))
    spec = plugin.cdi_spec([Device(id="ok-1"), Device(id="not/ok")])
    assert spec is not None and [d.name for d in spec.devices] == ["ok-1"]
    assert plugin.cdi_spec([Device(id="not/ok")]) is None
    assert FakePlugin(FakeResource()).cdi_spec([Device(id="a")]) is None


@pytest.mark.anyio
async def test_policy_through_the_kubelet(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    plugin = FakePlugin(FakeResource(count=4, numa_nodes=2, policy="numa"))
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(plugin, settings):
        await kubelet.wait_for_devices(RESOURCE)
        ids = ["fake-0", "fake-1", "fake-2", "fake-3"]
        assert await kubelet.preferred_allocation(RESOURCE, ids, ["fake-3"], 2) == ["fake-3", "fake-1"]
    async with FakeKubelet(settings.device_plugin_dir) as kubelet:
        async with serving(FakePlugin(FakeResource()), settings):
            await kubelet.wait_for_devices(RESOURCE)
            with pytest.raises(KubeletError, match="does not advertise"):
                await kubelet.preferred_allocation(RESOURCE, ["fake-0", "fake-1"], [], 1)


@pytest.mark.anyio
async def test_the_process_with_policy_and_cdi(short_dir: Path) -> None:
    dp, cdi_dir = short_dir / "dp", short_dir / "cdi"
    command = [sys.executable, "-m", "devplug_fake", "--device-plugin-dir", str(dp), "--count", "4"]
    command += ["--numa-nodes", "2", "--policy", "numa", "--cdi", "--cdi-dir", str(cdi_dir)]
    async with FakeKubelet(dp) as kubelet:
        process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        async with process:
            try:
                reg = await kubelet.wait_for_registration(RESOURCE, timeout=15)
                assert reg.options.get_preferred_allocation_available
                # The spec is on disk before the kubelet has the devices.
                assert (cdi_dir / "example.com-fake.json").exists()
                ids = ["fake-0", "fake-1", "fake-2", "fake-3"]
                assert await kubelet.preferred_allocation(RESOURCE, ids, [], 2) == ["fake-0", "fake-2"]
            finally:
                signal_child(process, signal.SIGTERM)
                with anyio.fail_after(5):
                    assert await process.wait() == 0
    assert list(cdi_dir.iterdir()) == []  # removed on SIGTERM
