from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from devplug import ConfigError, Device, Health, load_settings
from devplug_fake import DeviceChange, FakePlugin, FakeResource, FakeSettings, Faults, HealthFlap


def test_generated_devices_and_numa() -> None:
    plugin = FakePlugin(FakeResource(count=5, numa_nodes=2))
    devices = plugin.generated_devices()
    assert [d.id for d in devices] == ["fake-0", "fake-1", "fake-2", "fake-3", "fake-4"]
    assert [d.numa_nodes for d in devices] == [(0,), (1,), (0,), (1,), (0,)]
    assert FakePlugin(FakeResource(count=2)).generated_devices()[1].numa_nodes == ()


def test_timeline_and_flaps() -> None:
    faults = Faults(
        timeline=(
            DeviceChange(at=2, add=(Device(id="new"),)),
            DeviceChange(at=5, remove=("fake-0",)),
        ),
        health_flaps=(HealthFlap(device="fake-1", every=3, down_for=1, first_at=1),),
    )
    plugin = FakePlugin(FakeResource(count=2, faults=faults))
    base = plugin.generated_devices()

    def view(t: float) -> list[tuple[str, str]]:
        return [(d.id, d.health.value[0]) for d in plugin.devices_at(base, t)]

    assert view(0) == [("fake-0", "H"), ("fake-1", "H")]
    assert view(1.5) == [("fake-0", "H"), ("fake-1", "U")]
    assert view(2.5) == [("fake-0", "H"), ("fake-1", "H"), ("new", "H")]
    assert view(4.2) == [("fake-0", "H"), ("fake-1", "U"), ("new", "H")]
    assert view(6) == [("fake-1", "H"), ("new", "H")]
    flapped = {d.id: d.health_message for d in plugin.devices_at(base, 1.5)}
    assert flapped == {"fake-0": "", "fake-1": "health flap: Unhealthy for 1 s every 3 s"}
    # The next instant anything changes, so the plugin sleeps exactly until then.
    assert [plugin.next_change_after(t) for t in (0, 1, 1.5, 2, 4.5, 5)] == [1, 2, 2, 4, 5, 7]
    assert FakePlugin(FakeResource()).next_change_after(0) == math.inf


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"count": -1}, "count"),
        ({"faults": {"allocate_error_probability": 2}}, "allocate_error_probability"),
        (
            {"faults": {"health_flaps": [{"device": "a", "every": 1, "down_for": 1}]}},
            "down_for must be shorter",
        ),
        ({"faults": {"latency": 1}}, "latency"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_resource_config(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        FakeResource.model_validate(data)


def test_scenario_file(tmp_path: Path) -> None:
    config = tmp_path / "scenario.yaml"
    config.write_text(
        """
log_level: debug
resources:
  - name: example.com/gpu
    count: 2
    faults: {allocate_error_every: 3}
  - name: example.com/nic
    cdi: true
"""
    )
    settings = load_settings(FakeSettings, ["--config", str(config)])
    names = [r.name for r in settings.resource_configs()]
    assert names == ["example.com/gpu", "example.com/nic"]
    assert settings.resource_configs()[0].faults.allocate_error_every == 3


def test_scenario_file_errors_name_the_field(tmp_path: Path) -> None:
    config = tmp_path / "scenario.yaml"
    config.write_text("resources:\n  - name: example.com/gpu\n    faults: {allocate_error_evry: 3}\n")
    with pytest.raises(
        ConfigError, match=r"^invalid setting resources\.0\.faults\.allocate_error_evry: unknown setting"
    ):
        load_settings(FakeSettings, ["--config", str(config)])


def test_flags() -> None:
    settings = load_settings(
        FakeSettings, ["--resource", "example.com/x", "--count", "2", "--cdi", "--device-specs"]
    )
    (resource,) = settings.resource_configs()
    assert (resource.name, resource.count, resource.cdi, resource.device_specs) == (
        "example.com/x",
        2,
        True,
        True,
    )


@pytest.mark.anyio
async def test_allocate_response_and_injected_errors() -> None:
    plugin = FakePlugin(FakeResource(device_specs=True, cdi=True, faults=Faults(allocate_error_every=2)))
    devices = [Device(id="fake-3"), Device(id="fake-1", health=Health.UNHEALTHY)]
    allocation = await plugin.allocate(devices)
    assert allocation.envs == {"FAKE_VISIBLE_DEVICES": "fake-3,fake-1"}
    assert [(s.host_path, s.container_path) for s in allocation.devices] == [
        ("/dev/null", "/dev/fake-3"),
        ("/dev/null", "/dev/fake-1"),
    ]
    assert allocation.cdi_devices == ("example.com/fake=fake-3", "example.com/fake=fake-1")
    with pytest.raises(RuntimeError, match=r"injected allocate error \(call 2\)"):
        await plugin.allocate(devices)
    plain = await FakePlugin(FakeResource()).allocate(devices)
    assert plain.devices == () and plain.cdi_devices == ()
