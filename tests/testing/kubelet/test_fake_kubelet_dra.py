"""FakeKubelet in DRA mode: registration of DRA drivers through the plugin watcher."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.errors import KubeletError
from devplug.testing import FakeKubeAPI, FakeKubelet
from tests.support import never_within, wait_until
from tests.testing.dra_driver import DRIVER, RawDraDriver

if TYPE_CHECKING:
    from tests.testing.conftest import MakeDraDriver

pytestmark = pytest.mark.anyio

KNOWN = '["v1.DRAPlugin" "v1beta1.DRAPlugin"]'


async def statuses(driver: RawDraDriver, count: int = 1) -> list[tuple[bool, str]]:
    await wait_until(lambda: len(driver.statuses) >= count)
    return driver.statuses


# -- which service ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("services", "serve", "chosen"),
    [
        (("v1.DRAPlugin", "v1beta1.DRAPlugin"), ("v1", "v1beta1"), "v1"),
        (("v1beta1.DRAPlugin",), ("v1beta1",), "v1beta1"),
        # The plugin's order decides (kubelet >= 1.34), not the kubelet's preference.
        (("v1beta1.DRAPlugin", "v1.DRAPlugin"), ("v1", "v1beta1"), "v1beta1"),
        (("v1alpha1.DRAResourceHealth", "v1.DRAPlugin"), ("v1",), "v1"),
    ],
)
async def test_the_first_known_service_of_the_plugin_is_used(
    dra_kubelet: FakeKubelet,
    make_dra_driver: MakeDraDriver,
    services: tuple[str, ...],
    serve: tuple[str, ...],
    chosen: str,
) -> None:
    driver = await make_dra_driver(services=services, serve=serve)
    registration = await dra_kubelet.wait_for_dra_registration(DRIVER)
    assert registration.service == f"{chosen}.DRAPlugin"
    assert registration.endpoint == str(driver.dra_socket)
    assert registration.socket == str(driver.reg_socket)
    assert registration.services == services
    assert await statuses(driver) == [(True, "")]
    instance = await dra_kubelet.wait_for_usable(DRIVER)
    assert instance.service == f"{chosen}.DRAPlugin"
    await dra_kubelet.prepare(DRIVER, [("default", "c1", "uid-1")])
    assert driver.calls == [(chosen, "prepare", ["uid-1"])]


@pytest.mark.parametrize(
    ("services", "problem"),
    [
        (
            ("v1alpha3.NodeService",),
            'none of services supported by the plugin (["v1alpha3.NodeService"]) '
            f"are supported by the kubelet ({KNOWN})",
        ),
        (("v1alpha1.DRAResourceHealth",), "none of services supported by the plugin"),
        ((), "empty list of supported gRPC services (aka supported versions)"),
    ],
)
async def test_unknown_services_are_refused_and_retried(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver, services: tuple[str, ...], problem: str
) -> None:
    driver = await make_dra_driver(services=services)
    # Not known to the kubelet yet: it tries again after its back-off (500 ms first).
    ((registered, error), *_) = await statuses(driver, count=2)
    assert not registered
    assert error.startswith(
        "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of "
        f"DRA driver plugin {DRIVER} at endpoint {driver.dra_socket}: {problem}"
    )
    assert dra_kubelet.dra_drivers == {}
    attempt = await dra_kubelet.wait_for_dra_attempt(lambda r: r.driver == DRIVER)
    assert not attempt.accepted
    assert attempt.error == error


async def test_an_empty_endpoint_means_the_registration_socket(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver(endpoint="")
    registration = await dra_kubelet.wait_for_dra_registration(DRIVER)
    assert registration.endpoint == str(driver.reg_socket)


async def test_the_same_endpoint_twice_is_refused_once(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    first = await make_dra_driver("a")
    await dra_kubelet.wait_for_dra_registration(DRIVER)
    # A second instance whose registration socket names the first one's DRA socket.
    second = await make_dra_driver("b", reg_name="second-reg.sock", endpoint=str(first.dra_socket))
    ((registered, error),) = await statuses(second)
    assert not registered
    assert error == (
        "RegisterPlugin error -- plugin registration failed with err: "
        f"endpoint {first.dra_socket} already registered for DRA driver plugin {DRIVER}"
    )
    # Known to the kubelet from that step on: not retried.
    await never_within(lambda: second.info_calls != 1, 0.8, what="a second GetInfo")
    assert [i.socket for i in dra_kubelet.dra_drivers[DRIVER]] == [str(first.reg_socket)]
    # As in the kubelet, deleting the refused socket deregisters the endpoint it named.
    await second.stop_registration()
    await dra_kubelet.wait_for_dra(lambda: DRIVER not in dra_kubelet.dra_drivers)


async def test_a_relative_endpoint_is_refused(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver(endpoint="dra.sock")
    ((registered, error),) = await statuses(driver)
    assert not registered
    assert error == (
        "RegisterPlugin error -- plugin registration failed with err: "
        "endpoint 'dra.sock' is not an absolute path"
    )


async def test_get_info_slower_than_a_second_is_refused(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver(serve_now=False)
    driver.info_delay = 1.3
    await driver.start()
    attempt = await dra_kubelet.wait_for_dra_attempt(lambda r: not r.accepted, timeout=5)
    assert attempt.driver == ""  # the type was not known yet
    assert attempt.error == (
        "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket "
        f"{driver.reg_socket}, err: rpc error: code = DeadlineExceeded desc = Deadline Exceeded"
    )
    assert driver.statuses == []
    driver.info_delay = 0.0
    await dra_kubelet.wait_for_dra_registration(DRIVER, timeout=5)
    assert await statuses(driver) == [(True, "")]


async def test_deleting_the_socket_deregisters(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver()
    await dra_kubelet.wait_for_usable(DRIVER)
    await driver.stop_registration()
    await dra_kubelet.wait_for_dra(lambda: DRIVER not in dra_kubelet.dra_drivers)
    with pytest.raises(KubeletError, match=f"DRA driver {DRIVER} is not registered") as caught:
        await dra_kubelet.prepare(DRIVER, [("default", "c1", "uid-1")])
    assert caught.value.code == "FAILED_PRECONDITION"
    assert str(caught.value) == f"prepare dynamic resources: DRA driver {DRIVER} is not registered"


async def test_the_newest_connected_instance_is_called(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    old = await make_dra_driver("a", reg_name="a-reg.sock")
    await dra_kubelet.wait_for_dra_registration(DRIVER)
    new = await make_dra_driver("b", reg_name="b-reg.sock")
    await dra_kubelet.wait_for_dra_registration(DRIVER, count=2)
    await dra_kubelet.wait_for_usable(DRIVER)
    await dra_kubelet.wait_for_dra(lambda: all(i.connected for i in dra_kubelet.dra_drivers[DRIVER]))
    assert dra_kubelet.dra_instance(DRIVER).endpoint == str(new.dra_socket)
    # The newest loses its connection: the older, still connected, one is called.
    await new.stop_dra()
    await dra_kubelet.wait_for_dra(lambda: dra_kubelet.dra_instance(DRIVER).endpoint == str(old.dra_socket))
    await dra_kubelet.prepare(DRIVER, [("default", "c1", "uid-1")])
    assert old.calls == [("v1", "prepare", ["uid-1"])]
    assert new.calls == []
    assert dra_kubelet.usable(DRIVER)


async def test_sockets_present_at_start_register_and_again_after_restart(
    short_dir: Path, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver()
    kubelet = FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "plugins_registry", dra=True)
    async with kubelet:
        await kubelet.wait_for_dra_registration(DRIVER)  # the status sent, not only usable
        await kubelet.wait_for_usable(DRIVER)
        await kubelet.prepare(DRIVER, [("default", "c1", "uid-1")])
        assert set(kubelet.prepared_claims) == {"uid-1"}
        await kubelet.restart()
        # Nothing is remembered; the socket is found and registered again, no new socket needed.
        assert kubelet.prepared_claims == {}
        await kubelet.wait_for_dra_registration(DRIVER, count=2)
        await kubelet.wait_for_usable(DRIVER)
        assert await statuses(driver, count=2) == [(True, ""), (True, "")]
        assert len(kubelet.dra_drivers[DRIVER]) == 1


async def test_a_restart_while_the_status_is_sent_still_counts_the_registration(
    short_dir: Path, make_dra_driver: MakeDraDriver
) -> None:
    """A driver is usable (and may be called) before its registration status is sent: a kubelet
    stopped in between has registered it all the same, and the next registration is the second.
    (The kubelet used to record nothing then, and waiting for registration 2 timed out.)"""
    driver = await make_dra_driver()
    driver.notify_delay = 30
    kubelet = FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "plugins_registry", dra=True)
    async with kubelet:
        await kubelet.wait_for_usable(DRIVER)
        assert kubelet.dra_registrations == []
        await wait_until(lambda: driver.notify_calls == 1)  # the status is being sent
        driver.notify_delay = 0
        await kubelet.restart()
        first, second = (
            await kubelet.wait_for_dra_registration(DRIVER, count=1),
            await kubelet.wait_for_dra_registration(DRIVER, count=2),
        )
    assert first.accepted
    assert first.error == (
        f"RegisterPlugin error -- failed to send registration status at socket {driver.reg_socket}, "
        "err: rpc error: code = Canceled desc = context canceled"
    )
    assert (second.accepted, second.error) == (True, None)
    assert driver.statuses == [(True, "")]


async def test_without_dra_mode_the_type_has_no_handler(
    short_dir: Path, make_dra_driver: MakeDraDriver
) -> None:
    driver = await make_dra_driver()
    async with FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "plugins_registry") as kubelet:
        ((registered, error), *_) = await statuses(driver)
        assert not registered
        assert error == (
            "RegisterPlugin error -- no handler registered for plugin type: DRAPlugin "
            f"at socket {driver.reg_socket}"
        )
        with pytest.raises(RuntimeError, match="dra=True"):
            kubelet.health(DRIVER)


def test_dra_mode_needs_the_registry_and_kube_api_needs_dra(short_dir: Path) -> None:
    with pytest.raises(ValueError, match="plugins_registry_dir"):
        FakeKubelet(short_dir / "dp", dra=True)
    with pytest.raises(ValueError, match="dra=True"):
        FakeKubelet(short_dir / "dp", plugins_registry_dir=short_dir / "reg", kube_api=FakeKubeAPI())
