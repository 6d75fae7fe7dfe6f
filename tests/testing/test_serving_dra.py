"""The DRA fixtures of the pytest plugin (fake_kube_api, fake_dra_kubelet) and serving_dra with them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

import devplug
from devplug import ContainerAllocation, Device, Health
from devplug.testing import FakeKubeAPI, FakeKubelet, serving_dra

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

pytestmark = pytest.mark.anyio

DRIVER = "widget.example.com"


class Widgets(devplug.DevicePlugin):
    resource_name = "example.com/widget"

    async def watch_devices(self) -> AsyncIterator[list[Device]]:
        yield [Device(id="w0"), Device(id="w1", health=Health.UNHEALTHY)]
        await anyio.sleep_forever()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation(envs={"WIDGETS": ",".join(d.id for d in devices)})


async def test_the_fixtures_are_a_node_of_a_fake_cluster(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    assert [n["metadata"]["name"] for n in fake_kube_api.nodes()] == ["node-1"]
    assert fake_dra_kubelet.node_name == "node-1"
    registry = fake_dra_kubelet.plugins_registry_dir
    assert registry is not None
    assert registry.name == "plugins_registry"
    assert registry.is_dir()
    assert len(str(registry)) < 50  # pytest's tmp_path may be too long for unix sockets
    assert fake_dra_kubelet.dra_drivers == {}


async def test_a_driver_served_next_to_the_fake_dra_kubelet_is_prepared_and_watched(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    async with serving_dra(Widgets(), fake_kube_api, fake_dra_kubelet, driver_name=DRIVER) as driver:
        await fake_dra_kubelet.wait_for_usable(DRIVER)
        assert driver.node == "node-1"
        assert fake_dra_kubelet.plugins_registry_dir is not None
        root = fake_dra_kubelet.plugins_registry_dir.parent
        assert driver.registration_socket.parent == fake_dra_kubelet.plugins_registry_dir
        assert driver.settings.cdi_dir == root / "cdi"
        health = await fake_dra_kubelet.wait_for_health(DRIVER, lambda h: len(h) == 2)
        assert health == {("node-1", "w0"): "Healthy", ("node-1", "w1"): "Unhealthy"}
        fake_kube_api.add_claim("default", "c", requests=[("widget", 1)], device_class=DRIVER)
        claim = fake_kube_api.allocate_claim("default", "c", node="node-1", driver=DRIVER)
        uid = claim["metadata"]["uid"]
        results = await fake_dra_kubelet.prepare(DRIVER, [("default", "c", uid)])
        assert [d.device for d in results[uid].devices] == ["w0"]  # w1 is tainted
        assert (root / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json").exists()


async def test_the_node_may_be_named(fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet) -> None:
    async with serving_dra(Widgets(), fake_kube_api, fake_dra_kubelet, node_name="node-2") as driver:
        assert driver.node == "node-2"
        assert "node-2" in [n["metadata"]["name"] for n in fake_kube_api.nodes()]


async def test_a_kubelet_without_the_dra_mode_is_refused(
    fake_kube_api: FakeKubeAPI, fake_kubelet: FakeKubelet
) -> None:
    with pytest.raises(ValueError, match="a FakeKubelet in DRA mode"):
        async with serving_dra(Widgets(), fake_kube_api, fake_kubelet):
            pass
