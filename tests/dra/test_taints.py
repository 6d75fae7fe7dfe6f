"""Device taints chosen by a plugin: the model's rules, the slice entries, and publication through
FakeKubeAPI (servers that drop taints, servers older than 1.35 that refuse effect None)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from devplug import Device, Health
from devplug._dra.inventory import Inventory
from devplug._dra.slices import chunks, device_entry, schedulable
from devplug.dra import DeviceTaint
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"
HOT = DeviceTaint("widget.example.com/overheated", "92C")
NOTE = DeviceTaint("widget.example.com/firmware", "old", "None")


@pytest.mark.parametrize(
    ("key", "value", "effect"),
    [
        ("overheated", "", "NoSchedule"),
        ("example.com/overheated", "92C", "NoExecute"),
        ("a.b-c.example/x_y.z", "v" * 63, "None"),
        ("x" * 63, "", "NoSchedule"),
    ],
)
def test_valid_taints(key: str, value: str, effect: str) -> None:
    taint = DeviceTaint(key, value, effect)  # type: ignore[arg-type]
    expected = {"key": key, "effect": effect} | ({"value": value} if value else {})
    assert taint.as_dict() == expected


@pytest.mark.parametrize(
    ("key", "value", "effect", "words"),
    [
        ("", "", "NoSchedule", "taint key"),
        ("-hot", "", "NoSchedule", "taint key"),
        ("x" * 64, "", "NoSchedule", "taint key"),
        ("Example.com/hot", "", "NoSchedule", "taint key"),
        ("a/b/hot", "", "NoSchedule", "taint key"),
        ("/hot", "", "NoSchedule", "taint key"),
        ("hot", "v" * 64, "NoSchedule", "taint value"),
        ("hot", "92 C", "NoSchedule", "taint value"),
        ("hot", "", "PreferNoSchedule", "effect"),
    ],
)
def test_invalid_taints_are_refused_clearly(key: str, value: str, effect: str, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        DeviceTaint(key, value, effect)  # type: ignore[arg-type]


def test_a_device_has_at_most_16_taints() -> None:
    Device(id="w", taints=tuple(DeviceTaint(f"k{i}") for i in range(16)))
    with pytest.raises(ValidationError, match="at most 16 taints"):
        Device(id="w", taints=tuple(DeviceTaint(f"k{i}") for i in range(17)))


def _entries(devices: list[Device]) -> list[dict[str, object]]:
    inventory = Inventory([Widgets()])
    inventory.update(0, devices)
    return [device_entry(e, DRIVER, taint_unhealthy=True) for e in inventory.current.entries]


def test_entries_carry_the_plugin_s_taints_else_the_unhealthy_one() -> None:
    entries = _entries(
        [
            Device(id="w0", taints=(HOT, NOTE)),
            Device(id="w1", health=Health.UNHEALTHY, taints=(NOTE,)),
            Device(id="w2", health=Health.UNHEALTHY),
            Device(id="w3"),
        ]
    )
    taints = {e["name"]: e.get("taints") for e in entries}
    assert taints == {
        "w0": [HOT.as_dict(), NOTE.as_dict()],
        "w1": [NOTE.as_dict()],  # the plugin's own taints replace the default one
        "w2": [{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}],
        "w3": None,
    }
    assert [len(c) for c in chunks(entries * 40)] == [64, 64, 32]  # taints: 64 per slice


def test_entries_without_taint_support_or_without_effect_none() -> None:
    inventory = Inventory([Widgets()])
    inventory.update(0, [Device(id="w0", taints=(HOT, NOTE))])
    (entry,) = inventory.current.entries
    assert "taints" not in device_entry(entry, DRIVER, taint_unhealthy=False)
    assert device_entry(entry, DRIVER, taint_unhealthy=True, effect_none=False)["taints"] == [HOT.as_dict()]


def test_schedulable() -> None:
    assert schedulable(Device(id="w", taints=(NOTE,)))
    assert not schedulable(Device(id="w", taints=(HOT,)))
    assert not schedulable(Device(id="w", health=Health.UNHEALTHY))


def _published(api: FakeKubeAPI) -> dict[str, list[dict[str, object]]]:
    return {
        d["name"]: [{k: v for k, v in t.items() if k != "timeAdded"} for t in d.get("taints") or ()]
        for s in api.slices(node=NODE, driver=DRIVER)
        for d in s["spec"]["devices"]
    }


async def test_taints_are_published_changed_and_removed(short_dir: Path) -> None:
    plugin = Widgets()
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([plugin], api, short_dir):
            await wait_until(lambda: len(_published(api)) == 4)
            plugin.set_devices([Device(id="w0", taints=(HOT,)), *plugin.devices[1:]])
            await wait_until(lambda: _published(api)["w0"] == [HOT.as_dict()])
            plugin.set_devices([Device(id="w0", taints=(NOTE,)), *plugin.devices[1:]])
            await wait_until(lambda: _published(api)["w0"] == [NOTE.as_dict()])
            plugin.set_devices([Device(id="w0"), *plugin.devices[1:]])
            await wait_until(lambda: _published(api) == {f"w{i}": [] for i in range(4)})


async def test_without_device_taints_tainted_devices_are_left_out_and_notes_dropped(
    short_dir: Path,
) -> None:
    plugin = Widgets(devices=[Device(id="w0"), Device(id="w1"), Device(id="w2")])
    async with FakeKubeAPI(device_taints=False) as api:
        api.add_node(NODE)
        async with driving([plugin], api, short_dir):
            await wait_until(lambda: len(_published(api)) == 3)
            plugin.set_devices(
                [Device(id="w0", taints=(HOT,)), Device(id="w1", taints=(NOTE,)), Device(id="w2")]
            )
            await wait_until(lambda: _published(api) == {"w1": [], "w2": []})


async def test_a_server_refusing_effect_none_gets_the_other_taints(short_dir: Path) -> None:
    plugin = Widgets(devices=[Device(id="w0", taints=(HOT, NOTE)), Device(id="w1")])
    message = (
        'ResourceSlice.resource.k8s.io "x" is invalid: spec.devices[0].taints[1].effect: '
        'Unsupported value: "None": supported values: "NoExecute", "NoSchedule"'
    )
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        api.fail(status=422, verbs=("create", "update"), resource="resourceslices", times=1, message=message)
        with capture_logs() as logs:
            async with driving([plugin], api, short_dir):
                await wait_until(lambda: _published(api) == {"w0": [HOT.as_dict()], "w1": []})
        assert [e for e in logs if e["event"] == "device_taint_effect_none_refused"]
        assert not [e for e in logs if e["event"] == "api_error"]
