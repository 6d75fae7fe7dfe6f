from __future__ import annotations

import pytest
from pydantic import ValidationError

from devplug import ContainerAllocation, Device, DevicePlugin, DeviceSpec, Health, Mount


def test_device_defaults_and_numa_shorthand() -> None:
    d = Device(id="gpu-0")
    assert d.health is Health.HEALTHY and d.healthy and d.numa_nodes == ()
    assert Device(id="a", numa_node=1).numa_nodes == (1,)
    assert Device(id="a", numa_node=None).numa_nodes == ()
    assert Device(id="a", numa_node=-1).numa_nodes == ()  # sysfs says -1 for "no NUMA"
    assert Device.model_validate({"id": "a", "health": "Unhealthy"}).health is Health.UNHEALTHY


@pytest.mark.parametrize(
    "data",
    [
        {"id": ""},
        {"id": "a", "health": "healthy"},  # the kubelet is case-sensitive, so is devplug
        {"id": "a", "numa_nodes": [-2]},
        {"id": "a", "numa_node": 0, "numa_nodes": [0]},
        {"id": "a", "colour": "red"},
    ],
)
def test_device_rejects(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Device.model_validate(data)


def test_device_is_frozen_and_hashable() -> None:
    d = Device(id="a")
    with pytest.raises(ValidationError):
        d.id = "b"  # type: ignore[misc]
    assert {d, Device(id="a")} == {d}
    assert d.with_health(Health.UNHEALTHY) == Device(id="a", health=Health.UNHEALTHY)


@pytest.mark.parametrize("perms", ["r", "rw", "rwm", "mw"])
def test_device_spec_permissions_ok(perms: str) -> None:
    assert DeviceSpec(container_path="/dev/x", host_path="/dev/x", permissions=perms).permissions == perms


@pytest.mark.parametrize("perms", ["", "x", "rr", "RW"])
def test_device_spec_permissions_bad(perms: str) -> None:
    with pytest.raises(ValidationError, match="permissions"):
        DeviceSpec(container_path="/dev/x", host_path="/dev/x", permissions=perms)


def test_device_spec_rw() -> None:
    assert DeviceSpec.rw("/dev/ttyUSB0") == DeviceSpec(
        container_path="/dev/ttyUSB0", host_path="/dev/ttyUSB0", permissions="rw"
    )
    assert DeviceSpec.rw("/dev/a", "/dev/b").container_path == "/dev/b"


def test_container_allocation_cdi_names() -> None:
    ok = ContainerAllocation(
        cdi_devices=("example.com/gpu=0",), mounts=(Mount(container_path="/a", host_path="/b"),)
    )
    assert ok.cdi_devices == ("example.com/gpu=0",)
    for bad in ("gpu0", "example.com/gpu", "example.com/gpu=", "gpu=0"):
        with pytest.raises(ValidationError, match="fully qualified"):
            ContainerAllocation(cdi_devices=(bad,))


def test_plugin_requires_the_two_methods() -> None:
    class Incomplete(DevicePlugin):
        resource_name = "example.com/x"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]
