"""Both APIs from one process (``api=device-plugin,dra``): one ledger of holders, so that a device
given through one API is withheld from the other until it is free, and the last races are
refused with the holder named. Served against the fake kubelet (its pod-resources API too) and
the fake API server, whose scheduler honours the slices' taints."""

from __future__ import annotations

import anyio
import pytest
from lightkube.resources.resource_v1 import ResourceSlice
from structlog.testing import capture_logs

from devplug import Health
from devplug.errors import KubeletError
from devplug.testing import FakeKubeAPI, FakeKubelet, serving_both
from devplug.testing._kubeapi.scheduler import AllocationError
from tests.support import Widgets, wait_until

pytestmark = pytest.mark.anyio

RESOURCE = "example.com/widget"
DRIVER = "widget.example.com"
HELD = f"{DRIVER}/device-plugin"


def tainted(api: FakeKubeAPI) -> set[str]:
    """The devices of the node's slices that carry the held-by-device-plugin taint."""
    return {
        device["name"]
        for piece in api.slices()
        for device in piece["spec"].get("devices") or ()
        if any(t["key"] == HELD for t in device.get("taints") or ())
    }


def unhealthy(kubelet: FakeKubelet) -> set[str]:
    return {d.id for d in kubelet.resource(RESOURCE).devices if d.health != Health.HEALTHY.value}


async def started(api: FakeKubeAPI, kubelet: FakeKubelet) -> None:
    await kubelet.wait_for_devices(RESOURCE, lambda devices: len(devices) == 4)
    await wait_until(lambda: len([d for s in api.slices() for d in s["spec"].get("devices") or ()]) == 4)
    await kubelet.wait_for_usable(DRIVER)


async def test_a_device_given_by_allocate_is_tainted_and_the_scheduler_leaves_it(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with serving_both(Widgets(), api, kubelet) as host:
        await started(api, kubelet)
        assert tainted(api) == set()
        await kubelet.allocate(RESOURCE, ["w1"], pod="team-a/train-0")
        await wait_until(lambda: tainted(api) == {"w1"}, what="w1 tainted in the slices")
        holder = host.ledger.holder(RESOURCE, "w1")
        assert holder is not None
        # Listed by pod-resources: the pod is named.
        await wait_until(lambda: "train-0" in str(host.ledger.holder(RESOURCE, "w1")))
        api.add_claim("ns", "all")
        with pytest.raises(AllocationError):
            api.allocate_claim("ns", "all", node=kubelet.node_name, driver=DRIVER, count=4)
        three = api.allocate_claim("ns", "all", node=kubelet.node_name, driver=DRIVER, count=3)
        assert "w1" not in {r["device"] for r in three["status"]["allocation"]["devices"]["results"]}
        # The pod ends: the device is offered again.
        kubelet.end_pod("team-a/train-0")
        await wait_until(lambda: tainted(api) == set(), timeout=10, what="the taint gone after the pod ended")
        state = host.debug_state()
        assert state["ledger"]["ready"] is True


async def test_a_claim_allocated_to_the_pool_is_unhealthy_on_the_device_plugin_side(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with serving_both(Widgets(), api, kubelet) as host:
        await started(api, kubelet)
        api.add_claim("ns", "c1")
        claim = api.allocate_claim("ns", "c1", node=kubelet.node_name, driver=DRIVER, devices=["w2"])
        # Before any prepare: the allocation alone withholds it.
        await wait_until(lambda: unhealthy(kubelet) == {"w2"}, what="w2 Unhealthy to the kubelet")
        assert kubelet.allocatable(RESOURCE) == 3
        ref = ("ns", "c1", claim["metadata"]["uid"])
        await kubelet.prepare(DRIVER, [ref], pod="ns/c1-pod")
        api.delete_claim("ns", "c1")  # gone from the API server, still prepared: still held
        await wait_until(lambda: not host.ledger._claims_allocated, what="the deletion seen")
        assert unhealthy(kubelet) == {"w2"}
        await kubelet.unprepare(DRIVER, [ref])
        kubelet.end_pod("ns/c1-pod")
        await wait_until(lambda: unhealthy(kubelet) == set(), what="w2 Healthy again after unprepare")
        assert kubelet.allocatable(RESOURCE) == 4


async def test_allocate_of_a_device_dra_holds_fails_naming_the_claim(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with serving_both(Widgets(), api, kubelet) as host:
        await started(api, kubelet)
        api.add_claim("ns", "c1")
        api.allocate_claim("ns", "c1", node=kubelet.node_name, driver=DRIVER, devices=["w0"])
        await wait_until(lambda: unhealthy(kubelet) == {"w0"})
        # The kubelet would not pick an Unhealthy device; a late Allocate of it is refused.
        with capture_logs() as logs, pytest.raises(KubeletError) as caught:
            await kubelet.allocate(RESOURCE, ["w0"])
        assert caught.value.code == "FAILED_PRECONDITION"
        assert "device w0 of resource example.com/widget is held through DRA by ns/c1" in str(caught.value)
        with pytest.raises(KubeletError):
            await kubelet.allocate(RESOURCE, ["w0", "w3"])
        assert host.ledger.conflicts["allocate"] == 2
        assert [e["event"] for e in logs].count("allocate_refused_held") == 1


async def test_a_prepare_of_a_device_a_pod_holds_is_a_claim_error_naming_the_pod(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with serving_both(Widgets(), api, kubelet) as host:
        await started(api, kubelet)
        api.add_claim("ns", "c1")
        # The scheduler allocates w3 just before the device-plugin side gives it to a pod.
        claim = api.allocate_claim("ns", "c1", node=kubelet.node_name, driver=DRIVER, devices=["w3"])
        uid = claim["metadata"]["uid"]
        await wait_until(lambda: host.ledger.from_plugin(RESOURCE, "w3"), what="the allocation seen")
        host.ledger.claim(uid, "ns/c1", None)  # as if the watch had not told yet
        await kubelet.allocate(RESOURCE, ["w3"], pod="team-b/infer-0")
        ref = ("ns", "c1", claim["metadata"]["uid"])
        await wait_until(lambda: "infer-0" in str(host.ledger.holder(RESOURCE, "w3")))
        results = await kubelet.prepare_raw(DRIVER, [ref])
        error = results[ref[2]].error
        assert "device w3 is held through the device plugin by team-b/infer-0 (container main)" in error
        assert host.ledger.conflicts["prepare"] == 1


async def test_nothing_is_served_before_the_holders_are_known_and_an_outage_releases_nothing(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with serving_both(Widgets(), api, kubelet) as host:
        await started(api, kubelet)
        await kubelet.allocate(RESOURCE, ["w0"], pod="team-a/p")
        await wait_until(lambda: "team-a/p" in str(host.ledger.holder(RESOURCE, "w0")))
        # The kubelet restarts: pod-resources is away meanwhile; nothing is released.
        await kubelet.stop(crash=True)
        with capture_logs() as logs:
            await wait_until(
                lambda: any(e["event"] == "pod_resources_unavailable" for e in logs),
                timeout=10,
                what="the outage logged",
            )
        assert tainted(api) == {"w0"}
        assert host.ledger.holder(RESOURCE, "w0") is not None


async def test_an_api_server_outage_keeps_the_claims_devices_withheld(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    async with serving_both(Widgets(), api, kubelet):
        await started(api, kubelet)
        api.add_claim("ns", "c1")
        api.allocate_claim("ns", "c1", node=kubelet.node_name, driver=DRIVER, devices=["w1"])
        await wait_until(lambda: unhealthy(kubelet) == {"w1"})
        with capture_logs() as logs:
            api.outage()
            await wait_until(
                lambda: any(e["event"] == "claims_unavailable" for e in logs),
                timeout=10,
                what="the outage logged",
            )
            await anyio.sleep(1.5)  # listed again and again meanwhile
        assert sum(e["event"] == "claims_unavailable" for e in logs) == 1  # logged once
        assert unhealthy(kubelet) == {"w1"}  # and nothing released
        api.restore()


async def test_a_restart_rebuilds_the_ledger_before_serving_either_api(
    fake_kube_api: FakeKubeAPI, fake_dra_kubelet: FakeKubelet
) -> None:
    api, kubelet = fake_kube_api, fake_dra_kubelet
    plugin = Widgets()
    async with serving_both(plugin, api, kubelet) as host:
        await started(api, kubelet)
        await kubelet.allocate(RESOURCE, ["w0"], pod="team-a/p0")
        api.add_claim("ns", "c1")
        claim = api.allocate_claim("ns", "c1", node=kubelet.node_name, driver=DRIVER, devices=["w3"])
        ref = ("ns", "c1", claim["metadata"]["uid"])
        await kubelet.prepare(DRIVER, [ref], pod="ns/c1-pod")
        await wait_until(lambda: host.ledger.counts() == {"device-plugin": 1, "dra": 1})
    # The process is gone; the pod and the claim are not. A new process learns both before it
    # offers anything: its first device list has w3 Unhealthy, its first slices w0 tainted.
    client = api.client()
    for piece in api.slices():
        await client.delete(ResourceSlice, piece["metadata"]["name"])
    await client.close()
    assert api.slices() == []
    async with serving_both(plugin, api, kubelet) as host:
        await started(api, kubelet)
        first = kubelet.resource(RESOURCE).raw_lists[0]
        assert {device for device, health, _ in first if health != "Healthy"} == {"w3"}
        assert tainted(api) == {"w0"}
        assert host.ledger.counts() == {"device-plugin": 1, "dra": 1}
