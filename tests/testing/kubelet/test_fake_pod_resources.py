"""FakeKubelet's pod-resources API (v1.PodResourcesLister), read over its real unix socket: the
pods a test named in allocate/prepare, as kubelet 1.37 lists them, through restarts and ends."""

from __future__ import annotations

import socket
import stat
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug._proto.dra.v1 import api_pb2 as dra_v1
from devplug._proto.podresources.v1 import api_pb2 as pb
from devplug._proto.podresources.v1 import api_pb2_grpc as pb_grpc
from devplug._runtime.podresources import Holder, read_holders
from devplug.errors import KubeletError
from devplug.testing import ClaimDevice, FakeKubelet, PodRef
from devplug.testing._kubelet.pods import PodClaim, PodDevice
from tests.testing.dra_driver import DRIVER, NODE

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

    from tests.testing.conftest import MakeDraDriver, RawList, RawPlugin
    from tests.testing.dra_driver import Context, RawDraDriver

    MakePlugin = Callable[..., Awaitable[RawPlugin]]

pytestmark = pytest.mark.anyio

RESOURCE = "example.com/widget"
# dev-0 on NUMA node 0, dev-1 on nodes 0 and 1, dev-2 without topology, dev-3 unhealthy.
DEVICES: RawList = [
    ("dev-0", "Healthy", (0,)),
    ("dev-1", "Healthy", (0, 1)),
    ("dev-2", "Healthy", ()),
    ("dev-3", "Unhealthy", (1,)),
]


@asynccontextmanager
async def lister(path: Path) -> AsyncIterator[Any]:
    """A PodResourcesLister stub on the unix socket ``path`` (a channel of its own subchannels, so
    that a kubelet restarted at the same path is dialled afresh)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"unix:{path}", options=options) as channel:
        yield pb_grpc.PodResourcesListerStub(channel)


async def listed(kubelet: FakeKubelet) -> list[pb.PodResources]:
    assert kubelet.pod_resources_socket is not None
    async with lister(kubelet.pod_resources_socket) as stub:
        answer = await stub.List(pb.ListPodResourcesRequest(), timeout=5)
    return list(answer.pod_resources)


async def got(kubelet: FakeKubelet, namespace: str, name: str) -> pb.PodResources:
    assert kubelet.pod_resources_socket is not None
    async with lister(kubelet.pod_resources_socket) as stub:
        answer = await stub.Get(pb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace), timeout=5)
    return answer.pod_resources


def device(device_id: str, node: int | None = None) -> pb.ContainerDevices:
    """One device as the kubelet lists it: an entry per device (and NUMA node)."""
    if node is None:
        return pb.ContainerDevices(resource_name=RESOURCE, device_ids=[device_id])
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)])
    return pb.ContainerDevices(resource_name=RESOURCE, device_ids=[device_id], topology=topology)


def claim_resource(device_name: str, *cdi: str, driver: str = DRIVER) -> pb.ClaimResource:
    return pb.ClaimResource(
        driver_name=driver,
        pool_name=NODE,
        device_name=device_name,
        cdi_devices=[pb.CDIDevice(name=c) for c in cdi],
    )


def default_cdi(uid: str) -> str:
    """The CDI device ID the raw driver answers for ``uid``'s dev-0."""
    return f"k8s.{DRIVER}/gpu={uid}-dev-0"


async def widgets(kubelet: FakeKubelet, make_plugin: MakePlugin, devices: RawList = DEVICES) -> RawPlugin:
    """A raw device plugin of RESOURCE registered with ``kubelet``, its devices listed."""
    plugin = await make_plugin(kubelet.device_plugin_dir / "widget.sock", RESOURCE, devices=devices)
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == len(devices))
    return plugin


async def gpus(kubelet: FakeKubelet, make_dra_driver: MakeDraDriver, **kwargs: Any) -> RawDraDriver:
    driver = await make_dra_driver(**kwargs)
    await kubelet.wait_for_usable(DRIVER)
    return driver


# -- where it is served ------------------------------------------------------------------------------


async def test_served_at_the_kubelet_root_next_to_the_device_plugin_directory(short_dir: Path) -> None:
    kubelet = FakeKubelet(short_dir / "device-plugins")
    assert kubelet.pod_resources_socket == short_dir / "pod-resources" / "kubelet.sock"
    assert not kubelet.pod_resources_socket.exists()  # nothing before start()
    async with kubelet:
        assert stat.S_ISSOCK(kubelet.pod_resources_socket.stat().st_mode)
        assert stat.S_IMODE((short_dir / "pod-resources").stat().st_mode) & 0o007 == 0
        assert await listed(kubelet) == []
    assert not kubelet.pod_resources_socket.exists()


async def test_another_socket_or_none(short_dir: Path) -> None:
    async with FakeKubelet(short_dir / "dp", pod_resources_socket=short_dir / "pr" / "api.sock") as kubelet:
        assert kubelet.pod_resources_socket == short_dir / "pr" / "api.sock"
        assert await listed(kubelet) == []
    async with FakeKubelet(short_dir / "dp2", pod_resources_socket=None) as kubelet:
        assert kubelet.pod_resources_socket is None
        assert not (short_dir / "pod-resources").exists()


def test_a_socket_path_too_long_is_refused(short_dir: Path) -> None:
    with pytest.raises(ValueError, match="AF_UNIX allows at most 107"):
        FakeKubelet(short_dir / "dp", pod_resources_socket=short_dir / ("x" * 100) / "kubelet.sock")


# -- List ---------------------------------------------------------------------------------------------


async def test_list_names_a_device_plugin_pod_s_devices_with_their_numa_nodes(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        await widgets(kubelet, make_plugin)
        # Without a pod nothing is recorded.
        await kubelet.allocate(RESOURCE, ["dev-0"])
        assert await listed(kubelet) == []
        allocation = await kubelet.allocate(RESOURCE, ["dev-1", "dev-2", "dev-1"], pod="ml/train")
        assert allocation.envs == {"WIDGETS": "dev-1,dev-2,dev-1"}  # the plugin's answer, as before
        (pod,) = await listed(kubelet)
    # One entry per device and NUMA node: dev-1 twice, dev-2 without topology; each ID once.
    assert pod == pb.PodResources(
        name="train",
        namespace="ml",
        containers=[
            pb.ContainerResources(
                name="main", devices=[device("dev-1", 0), device("dev-1", 1), device("dev-2")]
            )
        ],
    )
    assert not pod.containers[0].devices[2].HasField("topology")
    assert list(kubelet.pods) == ["ml/train"]
    assert kubelet.pods["ml/train"].containers["main"].devices == {
        RESOURCE: (PodDevice("dev-1", (0, 1)), PodDevice("dev-2"))
    }


async def test_a_later_allocate_of_a_container_replaces_its_devices_and_containers_are_apart(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        await widgets(kubelet, make_plugin)
        await kubelet.allocate(RESOURCE, ["dev-0"], pod="train")
        await kubelet.allocate(RESOURCE, ["dev-2"], pod="train")
        await kubelet.allocate(RESOURCE, ["dev-0"], pod=PodRef("default", "train", "sidecar"))
        (pod,) = await listed(kubelet)
    assert (pod.namespace, pod.name) == ("default", "train")
    assert [(c.name, list(c.devices)) for c in pod.containers] == [
        ("main", [device("dev-2")]),
        ("sidecar", [device("dev-0", 0)]),
    ]


async def test_a_failed_allocate_records_nothing(short_dir: Path, make_plugin: MakePlugin) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        plugin = await widgets(kubelet, make_plugin)

        async def refuse(request: Any, context: Any) -> Any:
            await context.abort(grpc.StatusCode.INTERNAL, "no widgets today")

        plugin.allocate_handler = refuse
        with pytest.raises(KubeletError, match="no widgets today"):
            await kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/train")
        with pytest.raises(KubeletError, match="not registered"):
            await kubelet.allocate("example.com/other", ["x"], pod="ml/train")
        assert await listed(kubelet) == []
        assert kubelet.pods == {}


@pytest.mark.parametrize("name", ["a/b/c", "/train", "ml/", ""])
async def test_a_bad_pod_name_is_refused_before_the_call(
    short_dir: Path, make_plugin: MakePlugin, name: str
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        plugin = await widgets(kubelet, make_plugin)
        with pytest.raises(ValueError, match="pod"):
            await kubelet.allocate(RESOURCE, ["dev-0"], pod=name)
        assert plugin.allocate_requests == []


async def test_list_names_a_dra_pod_s_claims_with_driver_pool_and_device(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    await gpus(dra_kubelet, make_dra_driver)
    # Without a pod nothing is recorded.
    await dra_kubelet.prepare(DRIVER, [("ml", "other", "uid-0")])
    assert await listed(dra_kubelet) == []
    await dra_kubelet.prepare(DRIVER, [("ml", "c1", "uid-1"), ("ml", "c2", "uid-2")], pod="ml/infer")
    (pod,) = await listed(dra_kubelet)
    assert pod == pb.PodResources(
        name="infer",
        namespace="ml",
        containers=[
            pb.ContainerResources(
                name="main",
                dynamic_resources=[
                    pb.DynamicResource(
                        claim_name="c1",
                        claim_namespace="ml",
                        claim_resources=[claim_resource("dev-0", default_cdi("uid-1"))],
                    ),
                    pb.DynamicResource(
                        claim_name="c2",
                        claim_namespace="ml",
                        claim_resources=[claim_resource("dev-0", default_cdi("uid-2"))],
                    ),
                ],
            )
        ],
    )
    assert not pod.containers[0].dynamic_resources[0].claim_resources[0].HasField("share_id")
    assert dra_kubelet.pods["ml/infer"].containers["main"].claims["c1"] == PodClaim(
        "ml",
        "c1",
        "uid-1",
        {DRIVER: (ClaimDevice(("gpu",), NODE, "dev-0", (default_cdi("uid-1"),)),)},
    )


def _two_devices_answer(share: str | None = None) -> Callable[[Any, Context], Awaitable[Any]]:
    async def handler(request: Any, context: Context) -> Any:
        response = dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            entry = response.claims[claim.uid]
            entry.devices.add(pool_name=NODE, device_name="dev-0", cdi_device_ids=["cdi/a=0", "cdi/a=1"])
            second = entry.devices.add(pool_name=NODE, device_name="dev-1", cdi_device_ids=["cdi/a=2"])
            if share is not None:
                second.share_id = share
        return response

    return handler


async def test_a_claim_s_cdi_devices_accumulate_per_driver_as_the_kubelet_lists_them(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await gpus(dra_kubelet, make_dra_driver)
    driver.prepare_handler = _two_devices_answer(share="s-1")
    await dra_kubelet.prepare(DRIVER, [("ml", "c1", "uid-1")], pod="ml/infer")
    (pod,) = await listed(dra_kubelet)
    (claim,) = pod.containers[0].dynamic_resources
    first, second = claim.claim_resources
    assert [c.name for c in first.cdi_devices] == ["cdi/a=0", "cdi/a=1"]
    # kubelet 1.37 appends to one list per driver: dev-1 is listed with dev-0's CDI devices too.
    assert [c.name for c in second.cdi_devices] == ["cdi/a=0", "cdi/a=1", "cdi/a=2"]
    assert not first.HasField("share_id")
    assert second.share_id == "s-1"


async def test_a_claim_of_another_namespace_is_refused_before_the_call(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await gpus(dra_kubelet, make_dra_driver)
    with pytest.raises(ValueError, match=r"claims other/c1 are not in the namespace of pod ml/infer"):
        await dra_kubelet.prepare(DRIVER, [("other", "c1", "uid-1")], pod="ml/infer")
    assert driver.calls == []
    assert dra_kubelet.pods == {}


async def test_a_failed_prepare_records_nothing(
    dra_kubelet: FakeKubelet, make_dra_driver: MakeDraDriver
) -> None:
    driver = await gpus(dra_kubelet, make_dra_driver)

    async def refuse(request: Any, context: Context) -> Any:
        response = dra_v1.NodePrepareResourcesResponse()
        response.claims["uid-1"].error = "not allocated"
        return response

    driver.prepare_handler = refuse
    with pytest.raises(KubeletError, match="not allocated"):
        await dra_kubelet.prepare(DRIVER, [("ml", "c1", "uid-1")], pod="ml/infer")
    assert await listed(dra_kubelet) == []


async def test_a_pod_with_both_apis_and_two_containers(
    dra_kubelet: FakeKubelet, make_plugin: MakePlugin, make_dra_driver: MakeDraDriver
) -> None:
    await widgets(dra_kubelet, make_plugin)
    await gpus(dra_kubelet, make_dra_driver)
    await dra_kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/mixed")
    await dra_kubelet.prepare(DRIVER, [("ml", "c1", "uid-1")], pod="ml/mixed")
    await dra_kubelet.prepare(DRIVER, [("ml", "c2", "uid-2")], pod=PodRef("ml", "mixed", "helper"))
    await dra_kubelet.allocate(RESOURCE, ["dev-2"], pod="ml/alone")
    main, helper = (await got(dra_kubelet, "ml", "mixed")).containers
    assert main == pb.ContainerResources(
        name="main",
        devices=[device("dev-0", 0)],
        dynamic_resources=[
            pb.DynamicResource(
                claim_name="c1",
                claim_namespace="ml",
                claim_resources=[claim_resource("dev-0", default_cdi("uid-1"))],
            )
        ],
    )
    assert helper.name == "helper"
    assert list(helper.devices) == []
    assert [r.device_name for d in helper.dynamic_resources for r in d.claim_resources] == ["dev-0"]
    # The reader devplug's runtime uses finds each holder.
    assert dra_kubelet.pod_resources_socket is not None
    holders = await read_holders(dra_kubelet.pod_resources_socket)
    assert holders.of_resource(RESOURCE) == {
        "dev-0": [Holder("ml", "mixed", "main")],
        "dev-2": [Holder("ml", "alone", "main")],
    }
    assert holders.of_driver(DRIVER, NODE) == {
        "dev-0": [Holder("ml", "mixed", "main"), Holder("ml", "mixed", "helper")]
    }


# -- Get ----------------------------------------------------------------------------------------------


async def test_get_answers_a_running_pod_as_list_does(short_dir: Path, make_plugin: MakePlugin) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        await widgets(kubelet, make_plugin)
        await kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/a")
        await kubelet.allocate(RESOURCE, ["dev-1"], pod="ml/b")
        pod = await got(kubelet, "ml", "b")
        assert pod == (await listed(kubelet))[1]
        assert pod.name == "b"
        assert [list(c.device_ids) for c in pod.containers[0].devices] == [["dev-1"], ["dev-1"]]


@pytest.mark.parametrize(("namespace", "name"), [("ml", "nope"), ("other", "a"), ("", "")])
async def test_get_of_a_pod_not_running_is_the_kubelet_s_error(
    short_dir: Path, make_plugin: MakePlugin, namespace: str, name: str
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        await widgets(kubelet, make_plugin)
        await kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/a")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await got(kubelet, namespace, name)
    # A plain Go error from the handler: UNKNOWN, not NOT_FOUND.
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == f"pod {name} in namespace {namespace} not found"


# -- GetAllocatableResources --------------------------------------------------------------------------


async def test_allocatable_resources_are_the_healthy_devices_whoever_holds_them(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    async with FakeKubelet(short_dir / "dp") as kubelet:
        await widgets(kubelet, make_plugin)
        await kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/a")
        assert kubelet.pod_resources_socket is not None
        async with lister(kubelet.pod_resources_socket) as stub:
            answer = await stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=5)
            # dev-3 is unhealthy; dev-0 counts though a pod holds it: capacity, not what is free.
            assert list(answer.devices) == [
                device("dev-0", 0),
                device("dev-1", 0),
                device("dev-1", 1),
                device("dev-2"),
            ]
            assert list(answer.cpu_ids) == []
            assert list(answer.memory) == []
            # The stream ended: every device is unhealthy, nothing is allocatable; the pod keeps its own.
            await kubelet.kill_stream(RESOURCE)
            answer = await stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=5)
            assert list(answer.devices) == []
            (pod,) = (await stub.List(pb.ListPodResourcesRequest(), timeout=5)).pod_resources
            assert [list(d.device_ids) for d in pod.containers[0].devices] == [["dev-0"]]


# -- end_pod ------------------------------------------------------------------------------------------


async def test_an_ended_pod_is_no_longer_listed_and_its_claims_stay_prepared(
    dra_kubelet: FakeKubelet, make_plugin: MakePlugin, make_dra_driver: MakeDraDriver
) -> None:
    await widgets(dra_kubelet, make_plugin)
    driver = await gpus(dra_kubelet, make_dra_driver)
    await dra_kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/done")
    await dra_kubelet.prepare(DRIVER, [("ml", "c1", "uid-1")], pod="ml/done")
    await dra_kubelet.allocate(RESOURCE, ["dev-1"], pod="ml/running")
    ended = dra_kubelet.end_pod(PodRef("ml", "done", "any-container"))
    assert (ended.namespace, ended.name, list(ended.containers)) == ("ml", "done", ["main"])
    assert [p.name for p in await listed(dra_kubelet)] == ["running"]
    assert list(dra_kubelet.pods) == ["ml/running"]
    with pytest.raises(grpc.aio.AioRpcError, match="pod done in namespace ml not found"):
        await got(dra_kubelet, "ml", "done")
    # The claim is the caller's to unprepare, as the kubelet does once its last pod is gone.
    assert set(dra_kubelet.prepared_claims) == {"uid-1"}
    assert [c for c in driver.calls if c[1] == "unprepare"] == []
    with pytest.raises(
        KeyError, match=r"pod ml/done is not running on the fake kubelet \(running: ml/running\)"
    ):
        dra_kubelet.end_pod("ml/done")
    dra_kubelet.end_pod("ml/running")
    assert await listed(dra_kubelet) == []
    with pytest.raises(KeyError, match=r"pod default/running is not running .*\(running: none\)"):
        dra_kubelet.end_pod("running")


# -- stop, crash, restart -----------------------------------------------------------------------------


async def test_pods_are_listed_again_after_a_restart_with_their_devices(
    dra_kubelet: FakeKubelet, make_plugin: MakePlugin, make_dra_driver: MakeDraDriver
) -> None:
    await widgets(dra_kubelet, make_plugin)
    await gpus(dra_kubelet, make_dra_driver)
    await dra_kubelet.allocate(RESOURCE, ["dev-1"], pod="ml/train")
    await dra_kubelet.prepare(DRIVER, [("ml", "c1", "uid-1")], pod="ml/train")
    before = await listed(dra_kubelet)
    socket_path = dra_kubelet.pod_resources_socket
    assert socket_path is not None
    for crash in (False, True):
        await dra_kubelet.restart(crash=crash)
        # The plugin has not registered again (its socket was deleted), and the claims were
        # forgotten: the pod's devices are listed all the same, as the kubelet's checkpoints keep them.
        assert RESOURCE not in dra_kubelet.resources
        assert dict(dra_kubelet.prepared_claims) == {}
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert await listed(dra_kubelet) == before
    assert [(r.resource_name, list(r.device_ids)) for r in before[0].containers[0].devices] == [
        (RESOURCE, ["dev-1"]),
        (RESOURCE, ["dev-1"]),
    ]
    assert before[0].containers[0].dynamic_resources[0].claim_name == "c1"
    # Nothing is allocatable until the plugin registers again.
    async with lister(socket_path) as stub:
        answer = await stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=5)
    assert list(answer.devices) == []


async def test_the_socket_goes_at_stop_and_a_crash_leaves_it_dead(
    short_dir: Path, make_plugin: MakePlugin
) -> None:
    kubelet = FakeKubelet(short_dir / "dp")
    path = kubelet.pod_resources_socket
    assert path is not None
    await kubelet.start()
    await widgets(kubelet, make_plugin)
    await kubelet.allocate(RESOURCE, ["dev-0"], pod="ml/a")
    await kubelet.stop()
    assert not path.exists()
    await kubelet.stop()  # twice: no harm
    assert list(kubelet.pods) == ["ml/a"]  # the pod table is kept

    await kubelet.start()
    assert [p.name for p in await listed(kubelet)] == ["a"]
    await kubelet.stop(crash=True)
    # Left behind, dead: nobody answers on it.
    assert stat.S_ISSOCK(path.lstat().st_mode)
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(path))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await listed(kubelet)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # The next start replaces it.
    async with kubelet:
        assert [p.name for p in await listed(kubelet)] == ["a"]
    assert not path.exists()
