"""FakeKubelet in DRA mode: the health stream, and the ResourceSlice wipes of the kubelet."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx2
import pytest

from devplug.testing import FakeKubeAPI, FakeKubelet, HealthReport
from tests.support import never_within
from tests.testing.dra_driver import DRIVER, NODE
from tests.testing.kubeapi.test_kubeapi_kit import post_slice, slice_body

if TYPE_CHECKING:
    from tests.testing.conftest import MakeDraDriver

pytestmark = pytest.mark.anyio

DEV0 = (NODE, "dev-0")
DEV1 = (NODE, "dev-1")


# -- health -----------------------------------------------------------------------------------------


async def test_health_follows_the_stream(dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver) -> None:
    driver = await make_dra_driver()
    assert await dra_kubelet.wait_for_health(DRIVER) == {DEV0: "Healthy"}
    driver.set_health([(NODE, "dev-0", 2, 0), (NODE, "dev-1", 0, 0)])
    health = await dra_kubelet.wait_for_health(DRIVER, lambda h: h.get(DEV0) == "Unhealthy")
    assert health == {DEV0: "Unhealthy", DEV1: "Unknown"}
    instance = dra_kubelet.dra_instance(DRIVER)
    assert instance.health_service == "v1alpha1.DRAResourceHealth"
    assert instance.health_messages[-1] == (
        HealthReport(pool=NODE, device="dev-0", health="Unhealthy"),
        HealthReport(pool=NODE, device="dev-1", health="Unknown"),
    )
    assert len(instance.health_received_at) == len(instance.health_messages)


async def test_a_device_not_reported_again_becomes_unknown(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    assert dra_kubelet.health_timeout == 30.0
    dra_kubelet.health_timeout = 0.5
    driver = await make_dra_driver()
    # dev-1 has a timeout of its own (health_check_timeout_seconds, 1.35+).
    driver.set_health([(NODE, "dev-0", 1, 0), (NODE, "dev-1", 1, 2)])
    await dra_kubelet.wait_for_health(DRIVER, lambda h: h == {DEV0: "Healthy", DEV1: "Healthy"})
    sent = time.monotonic()
    health = await dra_kubelet.wait_for_health(DRIVER, lambda h: h[DEV0] == "Unknown")
    assert time.monotonic() - sent > 0.4  # not before its timeout
    assert health[DEV1] == "Healthy"
    await dra_kubelet.wait_for_health(DRIVER, lambda h: h[DEV1] == "Unknown", timeout=3)
    # A new report brings both back.
    driver.resend_health()
    await dra_kubelet.wait_for_health(DRIVER, lambda h: h == {DEV0: "Healthy", DEV1: "Healthy"})


async def test_health_messages_are_kept_as_the_kubelet_keeps_them(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    dra_kubelet.health_timeout = 0.5
    driver = await make_dra_driver()
    driver.health_messages = {"dev-0": "XID 79", "dev-1": "x" * 2000}
    driver.set_health([(NODE, "dev-0", 2, 0), (NODE, "dev-1", 2, 30)])
    await dra_kubelet.wait_for_health(DRIVER, lambda h: h == {DEV0: "Unhealthy", DEV1: "Unhealthy"})
    # Cut to 1024 bytes, as the kubelet's truncateHealthMessage does.
    assert dra_kubelet.health_messages(DRIVER) == {DEV0: "XID 79", DEV1: "x" * 1021 + "..."}
    # Once a device reads Unknown its message is gone too; the other keeps its own.
    await dra_kubelet.wait_for_health(DRIVER, lambda h: h[DEV0] == "Unknown")
    assert dra_kubelet.health_messages(DRIVER) == {DEV0: "", DEV1: "x" * 1021 + "..."}


async def test_a_partial_message_keeps_the_devices_it_leaves_out(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver()
    driver.set_health([(NODE, "dev-0", 1, 0), (NODE, "dev-1", 1, 0)])
    await dra_kubelet.wait_for_health(DRIVER, lambda h: len(h) == 2)
    driver.set_health([(NODE, "dev-1", 2, 0)])
    health = await dra_kubelet.wait_for_health(DRIVER, lambda h: h[DEV1] == "Unhealthy")
    assert health[DEV0] == "Healthy"


async def test_the_end_of_the_stream_drops_the_driver_and_it_is_reopened(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    assert dra_kubelet.health_retry == 5.0
    dra_kubelet.health_retry = 0.2
    driver = await make_dra_driver()
    await dra_kubelet.wait_for_health(DRIVER)
    driver.end_health_streams()
    await dra_kubelet.wait_for_dra(lambda: dra_kubelet.dra_instance(DRIVER).health_error == "EOF")
    assert dra_kubelet.health(DRIVER) == {}
    driver._end_health = False
    await dra_kubelet.wait_for_health(DRIVER, timeout=3)
    assert dra_kubelet.dra_instance(DRIVER).health_streams >= 2


@pytest.mark.parametrize(
    ("services", "opened"),
    [
        (("v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"), "v1"),
        (("v1.DRAPlugin", "v1alpha1.DRAResourceHealth"), "v1alpha1"),
    ],
)
async def test_v1_health_is_preferred_when_advertised(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver, services: tuple[str, ...], opened: str
) -> None:
    driver = await make_dra_driver(services=services, serve=("v1", "v1-health", "v1alpha1-health"))
    await dra_kubelet.wait_for_health(DRIVER)
    assert driver.health_streams == [opened]
    assert dra_kubelet.dra_instance(DRIVER).health_service == f"{opened}.DRAResourceHealth"


async def test_no_health_stream_for_a_driver_that_advertises_none(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    # Kubelet 1.37 (1.34-1.36 opened v1alpha1 whether advertised or not).
    dra_kubelet.health_retry = 0.1
    driver = await make_dra_driver(services=("v1.DRAPlugin",), serve=("v1", "v1-health", "v1alpha1-health"))
    await dra_kubelet.wait_for_usable(DRIVER)
    await never_within(lambda: driver.health_streams, 0.5, what="a health stream")
    assert dra_kubelet.dra_instance(DRIVER).health_service is None
    assert dra_kubelet.dra_instance(DRIVER).health_streams == 0


async def test_an_advertised_health_service_not_served_is_retried(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    dra_kubelet.health_retry = 0.1
    await make_dra_driver(serve=("v1", "v1beta1"))
    await dra_kubelet.wait_for_usable(DRIVER)
    await dra_kubelet.wait_for_dra(lambda: dra_kubelet.dra_instance(DRIVER).health_streams >= 3)
    assert (dra_kubelet.dra_instance(DRIVER).health_error or "").startswith("rpc error: code = Unimplemented")
    assert dra_kubelet.health(DRIVER) == {}


# -- wipes ----------------------------------------------------------------------------------------


async def add_slices(api: FakeKubeAPI, *specs: tuple[str, str, str]) -> None:
    """Create slices (name, node, driver) through the API."""
    async with httpx2.AsyncClient(base_url=api.url, trust_env=False, timeout=10) as http:
        for name, node, driver in specs:
            response = await post_slice(http, slice_body(name, node=node, driver=driver))
            assert response.status_code == 201, response.text


def names(api: FakeKubeAPI) -> set[str]:
    return {s["metadata"]["name"] for s in api.slices()}


async def test_start_and_restart_wipe_the_nodes_slices(short_dir: Path, dra_api: FakeKubeAPI) -> None:
    dra_api.add_node("node-2")
    await add_slices(dra_api, ("a", NODE, DRIVER), ("b", NODE, "net.example.com"), ("c", "node-2", DRIVER))
    kubelet = FakeKubelet(
        short_dir / "dp", plugins_registry_dir=short_dir / "reg", dra=True, kube_api=dra_api, node_name=NODE
    )
    async with kubelet:
        # Every driver's slices of this node, at once; other nodes' stay.
        assert names(dra_api) == {"c"}
        await add_slices(dra_api, ("d", NODE, DRIVER))
        await kubelet.restart()
        assert names(dra_api) == {"c"}


async def test_restart_registers_drivers_again_and_they_can_republish(
    dra_kubelet: FakeKubelet, dra_api: FakeKubeAPI, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver()
    await dra_kubelet.wait_for_usable(DRIVER)
    await add_slices(dra_api, ("a", NODE, DRIVER))
    await dra_kubelet.restart()
    assert names(dra_api) == set()
    await dra_kubelet.wait_for_dra_registration(DRIVER, count=2)
    await dra_kubelet.wait_for_usable(DRIVER)
    assert [ok for ok, _ in driver.statuses] == [True, True]
    await add_slices(dra_api, ("b", NODE, DRIVER))
    # No wipe follows a registration that connects.
    await never_within(lambda: names(dra_api) != {"b"}, 0.3, what="a wipe")


async def test_slices_go_some_time_after_the_last_instance_deregistered(
    dra_kubelet: FakeKubelet, dra_api: FakeKubeAPI, make_dra_driver: MakeDraDriver
) -> None:
    assert dra_kubelet.wipe_delay == 30.0
    dra_kubelet.wipe_delay = 0.5
    driver = await make_dra_driver()
    await dra_kubelet.wait_for_usable(DRIVER)
    await add_slices(dra_api, ("a", NODE, DRIVER), ("b", NODE, "net.example.com"))
    await driver.stop_registration()
    gone = time.monotonic()
    await dra_kubelet.wait_for_dra(lambda: DRIVER not in dra_kubelet.dra_drivers)
    assert names(dra_api) == {"a", "b"}
    await dra_api.wait_for(lambda: names(dra_api) == {"b"}, timeout=3)
    assert time.monotonic() - gone >= 0.45


async def test_slices_go_some_time_after_the_driver_disconnected(
    dra_kubelet: FakeKubelet, dra_api: FakeKubeAPI, make_dra_driver: MakeDraDriver
) -> None:
    dra_kubelet.wipe_delay = 0.5
    driver = await make_dra_driver()
    await dra_kubelet.wait_for_usable(DRIVER)
    await add_slices(dra_api, ("a", NODE, DRIVER))
    # Still registered, but its DRA socket no longer answers: not usable (kubelet >= 1.34).
    await driver.stop_dra()
    await dra_kubelet.wait_for_dra(lambda: not dra_kubelet.usable(DRIVER))
    assert DRIVER in dra_kubelet.dra_drivers
    await dra_api.wait_for(lambda: names(dra_api) == set(), timeout=3)


async def test_the_wipe_is_cancelled_when_an_instance_comes_back_in_time(
    dra_kubelet: FakeKubelet, dra_api: FakeKubeAPI, make_dra_driver: MakeDraDriver
) -> None:
    dra_kubelet.wipe_delay = 3.0
    old = await make_dra_driver("a", reg_name="a-reg.sock")
    await dra_kubelet.wait_for_usable(DRIVER)
    await add_slices(dra_api, ("a", NODE, DRIVER))
    await old.stop()
    await dra_kubelet.wait_for_dra(lambda: DRIVER not in dra_kubelet.dra_drivers)
    gone = time.monotonic()
    # A rolling update: the new pod registers its own sockets before the delay is over.
    await make_dra_driver("b", reg_name="b-reg.sock")
    await dra_kubelet.wait_for_usable(DRIVER)
    assert time.monotonic() - gone < 3.0
    await never_within(lambda: names(dra_api) != {"a"}, gone + 3.3 - time.monotonic(), what="a wipe")


async def test_a_socket_deleted_while_its_registration_status_is_sent_leaves_the_watcher_running(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    # grpc.aio answers a cancelled call with a CancelledError that anyio's scopes do not know as
    # theirs: the watcher's task group used to end with it, and no later socket was registered.
    old = await make_dra_driver("a", reg_name="a-reg.sock", serve_now=False)
    old.notify_delay = 30.0
    await old.start()
    await dra_kubelet.wait_for_usable(DRIVER)
    await old.stop()
    await dra_kubelet.wait_for_dra(lambda: DRIVER not in dra_kubelet.dra_drivers)
    await make_dra_driver("b", reg_name="b-reg.sock")
    await dra_kubelet.wait_for_usable(DRIVER)


async def test_without_kube_api_nothing_is_wiped(short_dir: Path, dra_api: FakeKubeAPI) -> None:
    await add_slices(dra_api, ("a", NODE, DRIVER))
    async with FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "reg", dra=True):
        assert names(dra_api) == {"a"}
