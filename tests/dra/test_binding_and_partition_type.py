"""Binding conditions (KEP-5007) and the slices' partitionTypeAttribute (Kubernetes 1.37): the
models' rules and what the slices carry."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from devplug import Device
from devplug._dra.inventory import Inventory
from devplug._dra.slices import Pool, device_entry, partition_type_problem
from devplug.dra import CounterConsumption, CounterSet
from tests.support import Widgets

DRIVER = "widget.example.com"
ATTACHED = "widget.example.com/attached"
FAILED = "widget.example.com/attach-failed"


def entry_of(device: Device) -> dict[str, Any]:
    inventory = Inventory([Widgets(devices=[device])])
    inventory.update(0, [device])
    return device_entry(inventory.current.entries[0], DRIVER, taint_unhealthy=True)


def test_binding_conditions_are_published_with_the_device() -> None:
    device = Device(
        id="w0", binding_conditions=(ATTACHED,), binding_failure_conditions=(FAILED,), binds_to_node=True
    )
    entry = entry_of(device)
    assert entry["bindingConditions"] == [ATTACHED]
    assert entry["bindingFailureConditions"] == [FAILED]
    assert entry["bindsToNode"] is True
    plain = entry_of(Device(id="w1"))
    assert not {"bindingConditions", "bindingFailureConditions", "bindsToNode"} & set(plain)


@pytest.mark.parametrize(
    ("conditions", "failures", "problem"),
    [
        ((ATTACHED,), (), "go together"),
        ((), (FAILED,), "go together"),
        ((ATTACHED, ATTACHED), (FAILED,), "binding_conditions: a condition is named twice"),
        ((ATTACHED,), (ATTACHED,), "both a binding condition and a binding failure condition"),
        (tuple(f"c{i}" for i in range(5)), (FAILED,), "at most 4 binding_conditions"),
        ((ATTACHED,), tuple(f"f{i}" for i in range(5)), "at most 4 binding_failure_conditions"),
        (("not a type!",), (FAILED,), "is not a condition type"),
    ],
)
def test_binding_conditions_the_api_server_would_refuse_are_refused(
    conditions: tuple[str, ...], failures: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        Device(id="w0", binding_conditions=conditions, binding_failure_conditions=failures)


CARD = CounterSet(name="card-0", counters={"cores": "8"})


def part(name: str, profile: object = None) -> Device:
    attributes: dict[str, Any] = {} if profile is None else {"profile": profile}
    return Device(
        id=name,
        attributes=attributes,
        consumes_counters=(CounterConsumption(counter_set="card-0", counters={"cores": "4"}),),
        shared_counters=(CARD,),
    )


def test_the_partition_type_attribute_goes_on_slices_with_counter_consuming_devices() -> None:
    pool = Pool(DRIVER, "node-1", "uid-1", partition_type_attribute=f"{DRIVER}/profile")
    with_parts = pool.spec(1, 2, [entry_of(part("half-0", "half")), entry_of(Device(id="w9"))])
    assert with_parts["partitionTypeAttribute"] == f"{DRIVER}/profile"
    without = pool.spec(1, 2, [entry_of(Device(id="w9"))])
    assert "partitionTypeAttribute" not in without
    assert "partitionTypeAttribute" not in Pool(DRIVER, "node-1", "uid-1").spec(
        1, 1, [entry_of(part("h", "x"))]
    )


def test_a_partition_must_carry_its_type_as_a_string() -> None:
    name = f"{DRIVER}/profile"
    assert partition_type_problem(part("half-0", "half"), name, DRIVER) is None
    assert partition_type_problem(part("half-0"), name, DRIVER) == (
        "consumes counters but has no attribute profile, the driver's partition type attribute"
    )
    assert partition_type_problem(part("half-0", 2), name, DRIVER) == (
        "its partition type attribute profile is 2, not a string"
    )
    qualified = Device(
        id="q",
        attributes={name: "half"},
        consumes_counters=(CounterConsumption(counter_set="card-0", counters={"cores": "4"}),),
    )
    assert partition_type_problem(qualified, name, DRIVER) is None
