"""FakeKubelet in DRA mode: NodePrepareResources and NodeUnprepareResources as the kubelet calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.errors import KubeletError
from devplug.testing import ClaimDevice, ClaimResult, FakeKubelet
from tests.testing.dra_driver import DRIVER, NODE, RawDraDriver

if TYPE_CHECKING:
    from tests.testing.conftest import MakeDraDriver
    from tests.testing.dra_driver import Context

pytestmark = pytest.mark.anyio

C1 = ("default", "c1", "uid-1")
C2 = ("other", "c2", "uid-2")


async def ready(kubelet: FakeKubelet, make: MakeDraDriver, **kwargs: Any) -> RawDraDriver:
    driver = await make(**kwargs)
    await kubelet.wait_for_usable(DRIVER)
    return driver


async def test_prepare_and_unprepare_round_trip(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await ready(dra_kubelet, make_dra_driver)
    results = await dra_kubelet.prepare(DRIVER, [C1, C2])
    assert results == {
        uid: ClaimResult(
            devices=(
                ClaimDevice(
                    request_names=("gpu",),
                    pool=NODE,
                    device="dev-0",
                    cdi_device_ids=(f"k8s.{DRIVER}/gpu={uid}-dev-0",),
                ),
            )
        )
        for uid in ("uid-1", "uid-2")
    }
    assert dict(dra_kubelet.prepared_claims) == results
    # One call for every claim of the driver.
    assert driver.calls == [("v1", "prepare", ["uid-1", "uid-2"])]
    await dra_kubelet.unprepare(DRIVER, [C1])
    assert set(dra_kubelet.prepared_claims) == {"uid-2"}
    # Never prepared: still one entry, no error.
    await dra_kubelet.unprepare(DRIVER, [("default", "gone", "uid-9")])
    assert driver.calls[-1] == ("v1", "unprepare", ["uid-9"])


async def test_an_empty_request_gets_an_empty_answer(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    await ready(dra_kubelet, make_dra_driver)
    assert await dra_kubelet.prepare(DRIVER, []) == {}
    await dra_kubelet.unprepare(DRIVER, [])


async def test_share_id_comes_through_on_v1(dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver) -> None:
    driver = await ready(dra_kubelet, make_dra_driver)

    async def shared(request: Any, context: Context) -> Any:
        from devplug._proto.dra.v1 import api_pb2 as v1

        response = v1.NodePrepareResourcesResponse()
        response.claims["uid-1"].devices.add(pool_name=NODE, device_name="dev-0", share_id="s-1")
        return response

    driver.prepare_handler = shared
    ((device,),) = [r.devices for r in (await dra_kubelet.prepare(DRIVER, [C1])).values()]
    assert device.share_id == "s-1"
    assert device.request_names == ()


def _answer(*entries: tuple[str, str, list[tuple[str, str]]]) -> Any:
    """A prepare handler answering (uid, error, [(pool, device)]) entries."""
    from devplug._proto.dra.v1 import api_pb2 as v1

    async def handler(request: Any, context: Context) -> Any:
        response = v1.NodePrepareResourcesResponse()
        for uid, error, devices in entries:
            entry = response.claims.get_or_create(uid)
            entry.error = error
            for pool, device in devices:
                entry.devices.add(pool_name=pool, device_name=device)
        return response

    return handler


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (
            _answer(("uid-1", "", [(NODE, "dev-0")]), ("uid-x", "", [])),
            "NodePrepareResources returned result for unknown claim UID uid-x",
        ),
        (
            _answer(("uid-1", "claim default/c1 not allocated", [])),
            "NodePrepareResources failed for ResourceClaim c1: claim default/c1 not allocated",
        ),
        (_answer(), "NodePrepareResources skipped 1 ResourceClaims"),
        (
            _answer(("uid-1", "", [("", "dev-0")])),
            "NodePrepareResources returned a device without pool_name or device_name for ResourceClaim c1",
        ),
        (_answer(("uid-1", "", [(NODE, "")])), "a device without pool_name or device_name"),
    ],
    ids=["unknown-uid", "claim-error", "skipped", "no-pool", "no-device"],
)
async def test_the_kubelet_checks_the_prepare_answer(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver, handler: Any, message: str
) -> None:
    driver = await ready(dra_kubelet, make_dra_driver)
    driver.prepare_handler = handler
    with pytest.raises(KubeletError) as caught:
        await dra_kubelet.prepare(DRIVER, [C1])
    assert str(caught.value).startswith("prepare dynamic resources: NodePrepareResources ")
    assert message in str(caught.value)
    assert caught.value.code == "UNKNOWN"
    assert dra_kubelet.prepared_claims == {}
    # The raw call shows the answer as it came.
    assert isinstance(await dra_kubelet.prepare_raw(DRIVER, [C1]), dict)


async def test_a_grpc_error_fails_the_whole_call(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await ready(dra_kubelet, make_dra_driver)

    async def broken(request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "device on fire")

    driver.prepare_handler = broken
    driver.unprepare_handler = broken
    with pytest.raises(KubeletError) as caught:
        await dra_kubelet.prepare(DRIVER, [C1])
    assert str(caught.value) == (
        "prepare dynamic resources: NodePrepareResources: rpc error: code = Internal desc = device on fire"
    )
    assert caught.value.code == "INTERNAL"
    with pytest.raises(
        KubeletError, match=r"^unprepare dynamic resources: NodeUnprepareResources: rpc error"
    ):
        await dra_kubelet.unprepare(DRIVER, [C1])


async def test_the_call_has_the_kubelets_deadline(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    assert dra_kubelet.dra_call_timeout == 45.0
    driver = await ready(dra_kubelet, make_dra_driver)
    dra_kubelet.dra_call_timeout = 0.2
    driver.prepare_delay = 1.0
    with pytest.raises(KubeletError) as caught:
        await dra_kubelet.prepare(DRIVER, [C1])
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert str(caught.value) == (
        "prepare dynamic resources: NodePrepareResources: rpc error: code = DeadlineExceeded "
        "desc = context deadline exceeded"
    )


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"uid-1": "", "uid-x": ""}, "NodeUnprepareResources returned result for unknown claim UID uid-x"),
        ({"uid-1": "busy"}, "NodeUnprepareResources failed for ResourceClaim c1: busy"),
        ({}, "NodeUnprepareResources skipped 1 ResourceClaims"),
    ],
    ids=["unknown-uid", "claim-error", "skipped"],
)
async def test_the_kubelet_checks_the_unprepare_answer(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver, answers: dict[str, str], message: str
) -> None:
    from devplug._proto.dra.v1 import api_pb2 as v1

    driver = await ready(dra_kubelet, make_dra_driver)

    async def handler(request: Any, context: Context) -> Any:
        response = v1.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims.get_or_create(uid).error = error
        return response

    driver.unprepare_handler = handler
    with pytest.raises(KubeletError) as caught:
        await dra_kubelet.unprepare(DRIVER, [C1])
    assert str(caught.value) == f"unprepare dynamic resources: {message}"
    assert await dra_kubelet.unprepare_raw(DRIVER, [C1]) == answers


async def test_calls_use_v1beta1_when_chosen(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await ready(dra_kubelet, make_dra_driver, services=("v1beta1.DRAPlugin",), serve=("v1beta1",))
    (result,) = (await dra_kubelet.prepare(DRIVER, [C1])).values()
    assert result.devices[0].share_id is None
    await dra_kubelet.unprepare(DRIVER, [C1])
    assert [(version, method) for version, method, _ in driver.calls] == [
        ("v1beta1", "prepare"),
        ("v1beta1", "unprepare"),
    ]
