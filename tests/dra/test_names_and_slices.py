"""Device names, slice contents and the publishing plan (dra.md §5-6), without a server."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devplug import Device, Health
from devplug._dra.inventory import Inventory
from devplug._dra.names import default_driver_name, device_name
from devplug._dra.slices import Pool, chunks, comparable, device_entry, index_of, plan
from devplug._names import is_dns_label
from devplug.models import Version
from tests.support import Widgets

POOL = Pool("widget.example.com", "node-1", "uid-1")


@pytest.mark.parametrize(
    ("device_id", "name"),
    [("gpu-0", "gpu-0"), ("w0", "w0"), ("0", "0")],
)
def test_dns_label_ids_are_kept(device_id: str, name: str) -> None:
    assert device_name(device_id) == name


@given(st.text(min_size=1, max_size=120))
def test_every_id_gets_a_valid_stable_name(device_id: str) -> None:
    name = device_name(device_id)
    assert is_dns_label(name), name
    assert device_name(device_id) == name


def test_ids_that_read_alike_get_different_names() -> None:
    names = {device_name(i) for i in ("Fake_0", "fake_0", "fake-0", "FAKE-0", "fake.0")}
    assert len(names) == 5
    assert device_name("GPU-8a3c3c0e-5f1d-4b1a-9c2e-0d1e2f3a4b5c").startswith("gpu-8a3c3c0e-5f1d")


def test_default_driver_name() -> None:
    assert default_driver_name("example.com/serial") == "serial.example.com"
    assert default_driver_name("nvidia.com/gpu") == "gpu.nvidia.com"


def _inventory(devices: list[Device], plugin: Widgets | None = None) -> Inventory:
    inventory = Inventory([plugin or Widgets()])
    inventory.update(0, devices)
    return inventory


def test_device_entry_attributes_capacity_and_taint() -> None:
    device = Device(
        id="fake_0",
        numa_node=1,
        health=Health.UNHEALTHY,
        attributes={"model": "w", "cores": 8, "fast": True, "fw": Version("1.2.3")},
        capacity={"memory": "16Gi"},
    )
    entry = _inventory([device]).current.entries[0]
    out = device_entry(entry, "widget.example.com", taint_unhealthy=True)
    assert out["name"] == device_name("fake_0")
    assert out["attributes"] == {
        "cores": {"int": 8},
        "fast": {"bool": True},
        "fw": {"version": "1.2.3"},
        "id": {"string": "fake_0"},
        "model": {"string": "w"},
        "numaNode": {"int": 1},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "resourceName": {"string": "example.com/widget"},
    }
    assert out["capacity"] == {"memory": {"value": "16Gi"}}
    assert out["taints"] == [{"key": "widget.example.com/unhealthy", "effect": "NoSchedule"}]
    assert "taints" not in device_entry(entry, "widget.example.com", taint_unhealthy=False)


def test_too_many_attributes_with_the_driver_s_own_is_refused() -> None:
    device = Device(id="w", attributes={f"a{i}": i for i in range(31)})
    entry = _inventory([device]).current.entries[0]
    with pytest.raises(ValueError, match=r"33 attributes \(with id, resourceName\) and 0 .* limit of 32"):
        device_entry(entry, "widget.example.com", taint_unhealthy=True)


class _Plain(Widgets):
    dra_standard_attributes = False


def test_the_standard_numa_node_goes_with_every_device_that_has_one() -> None:
    # Kubernetes' own name (KEP-6072), also where devplug's attributes are off; none without a node.
    plain = _inventory([Device(id="a", numa_nodes=(1, 0)), Device(id="b")], plugin=_Plain())
    a, b = (device_entry(e, "widget.example.com", taint_unhealthy=True) for e in plain.current.entries)
    assert a["attributes"] == {"resource.kubernetes.io/numaNode": {"int": 1}}
    assert b["attributes"] == {}
    # A device's own attribute of that name wins.
    own = Device(id="c", numa_node=1, attributes={"resource.kubernetes.io/numaNode": 3})
    (c,) = (device_entry(e, "w", taint_unhealthy=True) for e in _inventory([own]).current.entries)
    assert c["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 3}


def test_chunks_follow_the_per_slice_limits() -> None:
    plain = [{"name": f"d{i}"} for i in range(300)]
    assert [len(c) for c in chunks(plain)] == [128, 128, 44]
    tainted = [*plain[:299], {"name": "t", "taints": [{}]}]
    assert [len(c) for c in chunks(tainted)] == [64, 64, 64, 64, 44]
    assert chunks([]) == [[]]


_rv = itertools.count(1)


def _stored(obj: dict[str, Any]) -> dict[str, Any]:
    """What a server returns for a create or an update of ``obj``."""
    meta = dict(obj["metadata"])
    if "name" not in meta:
        meta["name"] = meta.pop("generateName") + f"x{next(_rv)}"
    meta["resourceVersion"] = str(next(_rv))
    return {**obj, "metadata": meta}


def _apply(existing: list[dict[str, Any]], todo: Any) -> list[dict[str, Any]]:
    gone = {s["metadata"]["name"] for s in todo.delete}
    updated = {s["metadata"]["name"]: _stored(s) for s in todo.update}
    kept = [updated.get(s["metadata"]["name"], s) for s in existing if s["metadata"]["name"] not in gone]
    return kept + [_stored(s) for s in todo.create]


def _check_pool(slices: list[dict[str, Any]], devices: int) -> None:
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    assert len(generations) == 1
    assert counts == {len(slices)}
    assert sum(len(s["spec"]["devices"]) for s in slices) == devices
    for s in slices:
        assert s["spec"]["nodeName"] == "node-1"
        assert s["spec"]["pool"]["name"] == "node-1"
        assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"
        assert index_of(s["metadata"]["name"], POOL.driver, POOL.node) is not None


def _wanted(n: int, tag: str = "") -> list[list[dict[str, Any]]]:
    return chunks([{"name": f"d{i}", "attributes": {"t": {"string": tag}}} for i in range(n)])


def test_first_publication_then_nothing_to_do() -> None:
    todo = plan(POOL, _wanted(300), [], 0)
    assert todo.generation == 1
    assert len(todo.create) == 3
    assert not todo.update
    assert not todo.delete
    slices = _apply([], todo)
    _check_pool(slices, 300)
    assert not plan(POOL, _wanted(300), slices, 1)


def test_one_slice_changing_keeps_the_generation_two_bump_it() -> None:
    slices = _apply([], plan(POOL, _wanted(300), [], 0))
    one = _wanted(300)
    one[2][0] = {"name": "d256", "attributes": {"t": {"string": "changed"}}}
    todo = plan(POOL, one, slices, 1)
    assert (todo.generation, len(todo.update), len(todo.create)) == (1, 1, 0)
    todo = plan(POOL, _wanted(300, "all"), slices, 1)
    assert (todo.generation, len(todo.update)) == (2, 3)
    _check_pool(_apply(slices, todo), 300)


def test_shrinking_deletes_and_bumps() -> None:
    slices = _apply([], plan(POOL, _wanted(300), [], 0))
    todo = plan(POOL, _wanted(100), slices, 1)
    assert todo.generation == 2
    assert len(todo.delete) == 2
    after = _apply(slices, todo)
    _check_pool(after, 100)


def test_a_wiped_pool_comes_back_with_a_higher_generation() -> None:
    slices = _apply([], plan(POOL, _wanted(10), [], 0))
    todo = plan(POOL, _wanted(10), [], 4)
    assert todo.generation == 5
    assert len(todo.create) == 1
    partial = plan(POOL, _wanted(300), [slices[0]], 1)
    assert partial.generation == 2  # a slice is created: bumped


def test_foreign_and_stale_slices_are_deleted() -> None:
    slices = _apply([], plan(POOL, _wanted(10), [], 0))
    old = {**slices[0], "metadata": {**slices[0]["metadata"], "name": "00000-widget.example.com-node-1-old"}}
    old["spec"] = {**old["spec"], "pool": {**old["spec"]["pool"], "generation": 0}}
    odd = {**slices[0], "metadata": {**slices[0]["metadata"], "name": "someone-elses"}}
    todo = plan(POOL, _wanted(10), [*slices, old, odd], 1)
    assert {s["metadata"]["name"] for s in todo.delete} == {old["metadata"]["name"], "someone-elses"}
    assert not todo.update
    assert not todo.create


def test_server_filled_taint_time_is_not_a_difference() -> None:
    spec = {"devices": [{"name": "a", "taints": [{"key": "k", "effect": "NoSchedule"}]}]}
    stored = {"devices": [{"name": "a", "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "t"}]}]}
    assert comparable(stored) == comparable(spec)


def test_several_resources_get_prefixed_names() -> None:
    class Other(Widgets):
        resource_name = "example.com/gadget"

    inventory = Inventory([Widgets(), Other()])
    inventory.update(0, [Device(id="w0")])
    assert not inventory.current.complete
    inventory.update(1, [Device(id="w0")])
    assert inventory.current.complete
    assert sorted(inventory.current.by_name) == ["gadget-w0", "widget-w0"]
    with pytest.raises(ValueError, match="duplicate"):
        inventory.update(0, [Device(id="a"), Device(id="a")])


def test_explicit_names_and_no_standard_attributes() -> None:
    class Exact(Widgets):
        dra_standard_attributes = False

    inventory = Inventory([Exact()])
    inventory.update(0, [Device(id="GPU-1", name="gpu-0", attributes={"type": "gpu"})])
    (entry,) = inventory.current.entries
    assert entry.name == "gpu-0"
    assert device_entry(entry, "gpu.nvidia.com", taint_unhealthy=True)["attributes"] == {
        "type": {"string": "gpu"}
    }
    with pytest.raises(ValueError, match="share the DRA device name gpu-0"):
        inventory.update(0, [Device(id="a", name="gpu-0"), Device(id="b", name="gpu-0")])
    assert inventory.current.entries == (entry,)  # the last good set is kept
    with pytest.raises(ValueError, match="not a DNS label"):
        Device(id="x", name="GPU_0")
