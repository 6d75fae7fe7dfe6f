"""DRA against the real API server, scheduler, kubelet and containerd of e2e/node.

The DeviceClasses are deploy/'s own files, applied as shipped; claims are allocated by the real
scheduler, prepared by the driver through the real kubelet, and containerd applies the claim's
CDI spec to the container.
"""

from __future__ import annotations

import json
import signal
import time
from contextlib import AbstractContextManager
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from tests.e2e.node_kit import (
    ROOT,
    Node,
    device_nodes,
    events,
    localnode,
    log_of,
    noop_hook,
    plugin_process,
    stop_process,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)

FAKE_DRIVER = "fake.example.com"
BUSYBOX = localnode.BUSYBOX_IMAGE


def fake_driver(node: Node, tmp: Path, *extra: str) -> AbstractContextManager[Popen[bytes]]:
    return plugin_process(
        node, tmp, "devplug-fake", *node.dra_flags(), "--count", "4", "--log-format", "json", *extra
    )


def slices(node: Node, driver: str) -> list[dict[str, Any]]:
    items = node.get("resourceslices", namespace="")["items"]
    return [s for s in items if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == node.name]


def published(node: Node, driver: str) -> dict[str, dict[str, Any]]:
    """The devices the driver's slices offer now (newest pool generation), by name."""
    found = slices(node, driver)
    if not found:
        return {}
    newest = max(s["spec"]["pool"]["generation"] for s in found)
    return {
        d["name"]: d
        for s in found
        if s["spec"]["pool"]["generation"] == newest
        for d in s["spec"].get("devices", [])
    }


def without_slices(node: Node, driver: str = FAKE_DRIVER) -> None:
    """Delete what an earlier test's driver left of its pool (the kubelet wipes it only some time
    after the driver went): a test reading the first slices it sees reads its own driver's."""
    node.kubectl("delete", "resourceslices", "--field-selector", f"spec.driver={driver}", "--wait=true")


def claim(name: str, device_class: str, count: int = 1) -> dict[str, Any]:
    request = {"name": "dev", "exactly": {"deviceClassName": device_class, "count": count}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
    }


def template(name: str, device_class: str, count: int = 1) -> dict[str, Any]:
    """A ResourceClaimTemplate whose claims are `claim`'s."""
    body = claim(name, device_class, count)
    return {**body, "kind": "ResourceClaimTemplate", "spec": {"spec": body["spec"]}}


def allocated_devices(node: Node, pod: str) -> list[str]:
    """The devices of the claims the scheduler allocated for `pod`."""
    status = node.get("pod", pod)["status"]
    names = [
        s["resourceClaimName"] for s in status.get("resourceClaimStatuses", []) if s.get("resourceClaimName")
    ]
    spec = node.get("pod", pod)["spec"]
    names += [c["resourceClaimName"] for c in spec.get("resourceClaims", []) if c.get("resourceClaimName")]
    devices = []
    for name in names:
        results = node.get("resourceclaim", name)["status"]["allocation"]["devices"]["results"]
        devices += [r["device"] for r in results]
    return devices


def claim_specs(node: Node, driver: str) -> list[Path]:
    return sorted(p for p in node.cdi_dir.glob("*") if driver in p.name and "claim" in p.name)


@pytest.fixture
def fake_class(node: Node) -> str:
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "dra" / "deviceclass.yaml"))
    return FAKE_DRIVER


def test_a_claim_from_a_template_is_scheduled_prepared_and_reaches_the_container(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    with fake_driver(
        node, tmp_path, "--device-specs"
    ) as driver:  # /dev/null as /dev/<id>, in the claim's spec
        devices = wait_for(
            "the driver's slices",
            lambda: len(published(node, FAKE_DRIVER)) == 4 and published(node, FAKE_DRIVER),
        )
        assert set(devices) == {f"fake-{i}" for i in range(4)}
        node.apply(template("one-fake", fake_class))
        try:
            node.run_pod("dra-one", claims=[{"name": "dev", "resourceClaimTemplateName": "one-fake"}])
            (device,) = allocated_devices(node, "dra-one")
            env = node.pod_env("dra-one")
            assert env["FAKE_VISIBLE_DEVICES"] == device, env
            assert device_nodes(node.logs("dra-one", "PATH="))[device] == (1, 3)
            assert claim_specs(node, FAKE_DRIVER), list(node.cdi_dir.iterdir())
        finally:
            node.delete("pod", "dra-one")
            node.delete("resourceclaimtemplate", "one-fake")
        wait_for("the claim's CDI spec removed at unprepare", lambda: not claim_specs(node, FAKE_DRIVER))
        assert driver.poll() is None, log_of(driver)


def test_one_claim_shared_by_two_pods(node: Node, tmp_path: Path, fake_class: str) -> None:
    with fake_driver(node, tmp_path):
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
        node.apply(claim("shared", fake_class))
        claims = [{"name": "dev", "resourceClaimName": "shared"}]
        try:
            node.run_pod("dra-share-a", claims=claims)
            node.run_pod("dra-share-b", claims=claims)
            a = node.pod_env("dra-share-a")["FAKE_VISIBLE_DEVICES"]
            b = node.pod_env("dra-share-b")["FAKE_VISIBLE_DEVICES"]
            assert a == b
            reserved = node.get("resourceclaim", "shared")["status"]["reservedFor"]
            assert {r["name"] for r in reserved} == {"dra-share-a", "dra-share-b"}
        finally:
            node.delete("pod", "dra-share-a")
            node.delete("pod", "dra-share-b")
            node.delete("resourceclaim", "shared")
        wait_for("the shared claim's spec removed", lambda: not claim_specs(node, FAKE_DRIVER))


def test_shares_of_one_device_go_to_several_claims_up_to_its_capacity(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    """Consumable capacity (KEP-5075, beta and on in 1.37): one device published as shared by 2
    claims. The real scheduler gives two claims a share each (a default request, an explicit
    one), the kubelet has both prepared on the node, and a third claim waits until a share is
    freed."""
    if node.minor < 36:
        pytest.skip(f"DRAConsumableCapacity is alpha and off in 1.{node.minor} (beta and on from 1.36)")
    without_slices(node)
    with fake_driver(node, tmp_path, "--count", "1", "--shares", "2") as driver:
        (device,) = wait_for("the driver's slices", lambda: list(published(node, FAKE_DRIVER).values()))
        assert device["allowMultipleAllocations"] is True  # the server kept it: the feature is on
        assert device["capacity"]["shares"] == {
            "value": "2",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }
        explicit = claim("share-b", fake_class)
        explicit["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"shares": "1"}}
        node.apply(claim("share-a", fake_class), explicit, claim("share-c", fake_class))
        pods = {name: f"dra-{name}" for name in ("share-a", "share-b", "share-c")}
        try:
            for name in ("share-a", "share-b"):
                node.run_pod(pods[name], claims=[{"name": "dev", "resourceClaimName": name}])
            results = {
                name: node.get("resourceclaim", name)["status"]["allocation"]["devices"]["results"][0]
                for name in ("share-a", "share-b")
            }
            assert {r["device"] for r in results.values()} == {"fake-0"}
            assert len({r["shareID"] for r in results.values()}) == 2
            assert [r["consumedCapacity"] for r in results.values()] == [{"shares": "1"}] * 2
            for name in ("share-a", "share-b"):
                assert node.pod_env(pods[name])["FAKE_VISIBLE_DEVICES"] == "fake-0"
            node.run_pod(
                pods["share-c"], claims=[{"name": "dev", "resourceClaimName": "share-c"}], wait=False
            )
            wait_for(
                "the third claim's pod to be found unschedulable",
                lambda: any(
                    c["type"] == "PodScheduled" and c["status"] == "False"
                    for c in node.get("pod", pods["share-c"])["status"].get("conditions", [])
                ),
            )
            assert "allocation" not in node.get("resourceclaim", "share-c").get("status", {})
            node.delete("pod", pods["share-a"])
            node.delete("resourceclaim", "share-a")
            node.wait_running(pods["share-c"], timeout=120)
            (third,) = node.get("resourceclaim", "share-c")["status"]["allocation"]["devices"]["results"]
            assert third["device"] == "fake-0"
            assert third["shareID"] not in {r["shareID"] for r in results.values()}
        finally:
            for name, pod in pods.items():
                node.delete("pod", pod)
                node.delete("resourceclaim", name)
        wait_for("every share's spec removed", lambda: not claim_specs(node, FAKE_DRIVER))
        assert driver.poll() is None, log_of(driver)


def test_a_device_with_binding_conditions_waits_for_its_controller(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    """Binding conditions (KEP-5007, beta and on in 1.37): the real scheduler allocates the
    device but binds the pod only once a controller (here the test, as a driver's own controller
    would) sets the condition True in the claim's status.devices; then the kubelet has the claim
    prepared and the pod runs."""
    if node.minor < 36:
        pytest.skip(f"DRADeviceBindingConditions is alpha and off in 1.{node.minor} (beta and on from 1.36)")
    attached, failed = f"{FAKE_DRIVER}/attached", f"{FAKE_DRIVER}/attach-failed"
    device = {"id": "fake-0", "binding_conditions": [attached], "binding_failure_conditions": [failed]}
    state = tmp_path / "devices.json"
    state.write_text(json.dumps({"devices": [device]}))
    without_slices(node)
    with fake_driver(node, tmp_path, "--state-file", str(state)) as driver:
        (published_device,) = wait_for(
            "the driver's slices", lambda: list(published(node, FAKE_DRIVER).values())
        )
        assert published_device["bindingConditions"] == [attached]  # kept: the feature is on
        assert published_device["bindingFailureConditions"] == [failed]
        node.apply(claim("attach-me", fake_class))
        try:
            node.run_pod("dra-bound", claims=[{"name": "dev", "resourceClaimName": "attach-me"}], wait=False)
            (result,) = wait_for(
                "the claim allocated, the pod waiting for the binding condition",
                lambda: (
                    node.get("resourceclaim", "attach-me")
                    .get("status", {})
                    .get("allocation", {})
                    .get("devices", {})
                    .get("results")
                ),
            )
            assert result["bindingConditions"] == [attached]
            assert not node.get("pod", "dra-bound")["spec"].get("nodeName")  # not bound yet
            status = {
                "devices": [
                    {
                        "driver": result["driver"],
                        "pool": result["pool"],
                        "device": result["device"],
                        "conditions": [
                            {
                                "type": attached,
                                "status": "True",
                                "reason": "Attached",
                                "message": "attached by the test's controller",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }
                        ],
                    }
                ]
            }
            node.kubectl(
                "patch", "resourceclaim", "attach-me", "-n", "default", "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": status}),
            )  # fmt: skip
            node.wait_running("dra-bound", timeout=120)
            assert node.pod_env("dra-bound")["FAKE_VISIBLE_DEVICES"] == "fake-0"
        finally:
            node.delete("pod", "dra-bound")
            node.delete("resourceclaim", "attach-me")
        assert driver.poll() is None, log_of(driver)


def test_device_metadata_is_mounted_in_the_container(node: Node, tmp_path: Path, fake_class: str) -> None:
    """--device-metadata (KEP-5304): containerd applies the metadata's CDI spec, and the
    container reads its device's attributes at the path the Go helper's consumers expect."""
    root = "/var/run/kubernetes.io/dra-device-attributes"
    path = f"{root}/resourceclaims/with-meta/dev/{FAKE_DRIVER}-metadata.json"
    with fake_driver(node, tmp_path, "--device-metadata") as driver:
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
        node.apply(claim("with-meta", fake_class))
        try:
            node.run_pod(
                "dra-meta",
                claims=[{"name": "dev", "resourceClaimName": "with-meta"}],
                command=f"echo METADATA; cat {path}; echo; echo END; sleep 3600",
            )
            (device,) = allocated_devices(node, "dra-meta")
            text = node.logs("dra-meta", "END").split("METADATA", 1)[1].split("END", 1)[0]
            first = json.JSONDecoder().raw_decode(text.strip())[0]
            assert first["kind"] == "DeviceMetadata"
            assert first["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
            assert first["metadata"]["name"] == "with-meta"
            (request,) = first["requests"]
            assert [d["name"] for d in request["devices"]] == [device]
            assert request["devices"][0]["attributes"]["id"] == {"string": device}
        finally:
            node.delete("pod", "dra-meta")
            node.delete("resourceclaim", "with-meta")
        wait_for(
            "the metadata's spec removed at unprepare",
            lambda: not [p for p in node.cdi_dir.glob(f"{FAKE_DRIVER}_metadata_*")],
        )
        assert driver.poll() is None, log_of(driver)


def test_a_device_s_status_reaches_the_claim_under_deploy_dra_s_rbac(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    """Claim device status (GA in 1.37): what the driver's prepared device reports is written to
    the claim's status.devices and removed at unprepare, by a driver holding only deploy/dra's
    ServiceAccount and ClusterRole, with a token bound to a pod on the node (as a DaemonSet's
    pod has): the 1.36+ per-driver check (resourceclaims/driver, associated-node verbs) passes."""
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "dra" / "rbac.yaml"))
    holder = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "token-holder", "namespace": "kube-system"},
        "spec": {
            "nodeName": node.name,
            "hostNetwork": True,
            "serviceAccountName": "devplug-fake-dra",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    node.apply(holder)
    try:
        uid = node.get("pod", "token-holder", namespace="kube-system")["metadata"]["uid"]
        token = node.kubectl(
            "create", "token", "devplug-fake-dra", "-n", "kube-system", "--bound-object-kind", "Pod",
            "--bound-object-name", "token-holder", "--bound-object-uid", uid, "--duration", "1h",
        ).strip()  # fmt: skip
        admin = json.loads(Path(node.kubeconfig).read_text())
        admin["users"] = [{"name": "driver", "user": {"token": token}}]
        admin["contexts"][0]["context"]["user"] = "driver"
        kubeconfig = tmp_path / "driver-kubeconfig"
        kubeconfig.write_text(json.dumps(admin))
        flags = [*node.dra_flags(), "--kubeconfig", str(kubeconfig), "--driver-name", FAKE_DRIVER]
        without_slices(node)
        with plugin_process(
            node, tmp_path, "devplug", "run", *flags, "tests.e2e.dra_plugins:Reporting"
        ) as driver:
            wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 2)
            node.apply(claim("reported", fake_class))
            try:
                node.run_pod("dra-status", claims=[{"name": "dev", "resourceClaimName": "reported"}])
                (device,) = allocated_devices(node, "dra-status")
                (entry,) = wait_for(
                    "the device's status in the claim",
                    lambda: node.get("resourceclaim", "reported").get("status", {}).get("devices"),
                )
                assert (entry["driver"], entry["pool"], entry["device"]) == (FAKE_DRIVER, node.name, device)
                (condition,) = entry["conditions"]
                assert (condition["type"], condition["status"], condition["message"]) == (
                    "Ready",
                    "True",
                    device,
                )
                assert entry["data"] == {"device": device}
                assert entry["networkData"] == {"interfaceName": f"net-{device}", "ips": ["10.9.8.7/24"]}
                assert "claim_status_failed" not in log_of(driver)
            finally:
                node.delete("pod", "dra-status")
            wait_for(
                "the entry removed after the unprepare",
                lambda: not node.get("resourceclaim", "reported").get("status", {}).get("devices"),
            )
            node.delete("resourceclaim", "reported")
            assert driver.poll() is None, log_of(driver)
    finally:
        node.delete("pod", "token-holder", namespace="kube-system")


def test_fields_a_1_37_server_drops_are_noticed_and_no_longer_sent(node: Node, tmp_path: Path) -> None:
    """Alpha in 1.37, off by default: list-valued attributes (the server drops the values, then
    refuses the empty attribute) and partitionTypeAttribute (dropped). The driver notices each from
    the real API server's answer, says so once, and keeps its slices still."""
    if node.minor < 37:
        pytest.skip("partitionTypeAttribute came with 1.37")
    state = tmp_path / "devices.json"
    listed = {"id": "fake-0", "numa_nodes": [0, 1], "attributes": {"links": [2, 3], "model": "w"}}
    state.write_text(json.dumps({"devices": [listed]}))
    without_slices(node)
    with fake_driver(node, tmp_path, "--state-file", str(state), "--list-attributes") as driver:
        (device,) = wait_for("the driver's slices", lambda: list(published(node, FAKE_DRIVER).values()))
        assert "links" not in device["attributes"]
        assert device["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}
        wait_for("the refusal noticed", lambda: "list_attributes_refused" in log_of(driver))
        versions = [s["metadata"]["resourceVersion"] for s in slices(node, FAKE_DRIVER)]
        time.sleep(3)
        assert [s["metadata"]["resourceVersion"] for s in slices(node, FAKE_DRIVER)] == versions
    flags = [*node.dra_flags(), "--driver-name", FAKE_DRIVER, "--log-format", "json"]
    with plugin_process(
        node, tmp_path, "devplug", "run", *flags, "tests.e2e.dra_plugins:Partitions"
    ) as driver:
        wait_for(
            "the partitions' slices", lambda: sorted(published(node, FAKE_DRIVER)) == ["half-0", "half-1"]
        )
        wait_for("the drop noticed", lambda: "partition_type_attribute_dropped" in log_of(driver))
        assert not any("partitionTypeAttribute" in s["spec"] for s in slices(node, FAKE_DRIVER))
        versions = [s["metadata"]["resourceVersion"] for s in slices(node, FAKE_DRIVER)]
        time.sleep(3)
        assert [s["metadata"]["resourceVersion"] for s in slices(node, FAKE_DRIVER)] == versions
        assert driver.poll() is None, log_of(driver)


def test_kubelet_restart_slices_come_back_and_the_pod_keeps_running(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    with fake_driver(node, tmp_path) as driver:
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
        node.apply(template("kr-fake", fake_class))
        try:
            pod = node.run_pod("dra-kr", claims=[{"name": "dev", "resourceClaimTemplateName": "kr-fake"}])
            before = {sl["metadata"]["uid"] for sl in slices(node, FAKE_DRIVER)}
            node.restart("kubelet", signal.SIGTERM)
            node.wait_ready()

            def republished() -> (
                bool
            ):  # the kubelet wiped the node's slices at start; devplug wrote them again
                uids = {sl["metadata"]["uid"] for sl in slices(node, FAKE_DRIVER)}
                return len(published(node, FAKE_DRIVER)) == 4 and not uids & before

            wait_for("the slices wiped by the restarted kubelet and published again", republished, timeout=60)
            again = node.get("pod", "dra-kr")
            assert again["metadata"]["uid"] == pod["metadata"]["uid"]
            assert again["status"]["phase"] == "Running"
            node.run_pod("dra-kr2", claims=[{"name": "dev", "resourceClaimTemplateName": "kr-fake"}])
            assert set(allocated_devices(node, "dra-kr")).isdisjoint(allocated_devices(node, "dra-kr2"))
        finally:
            node.delete("pod", "dra-kr")
            node.delete("pod", "dra-kr2")
            node.delete("resourceclaimtemplate", "kr-fake")
        wait_for("the claims' specs removed", lambda: not claim_specs(node, FAKE_DRIVER))
        assert driver.poll() is None, log_of(driver)


def test_driver_restart_while_a_claim_is_prepared(node: Node, tmp_path: Path, fake_class: str) -> None:
    state = tmp_path / "state"
    with fake_driver(node, tmp_path) as first:
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
        node.apply(template("dr-fake", fake_class))
        node.run_pod("dra-dr", claims=[{"name": "dev", "resourceClaimTemplateName": "dr-fake"}])
        assert claim_specs(node, FAKE_DRIVER)
        assert stop_process(first) == 0, log_of(first)
    state.mkdir()
    try:
        with fake_driver(node, tmp_path / "state") as second:
            wait_for("the slices of the restarted driver", lambda: len(published(node, FAKE_DRIVER)) == 4)
            node.delete("pod", "dra-dr")
            wait_for(
                "the claim unprepared by the restarted driver", lambda: not claim_specs(node, FAKE_DRIVER)
            )
            assert second.poll() is None, log_of(second)
            assert '"event": "unprepared"' in log_of(second) or "unprepare" in log_of(second)
    finally:
        node.delete("pod", "dra-dr")
        node.delete("resourceclaimtemplate", "dr-fake")


def test_an_unhealthy_device_is_tainted_and_the_next_claim_gets_another(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    """A pod holds a device that turns unhealthy: the device is tainted (or, where the API server
    drops taints, left out), the pod's status shows the device's health (the kubelet reads the
    driver's health stream: ResourceHealthStatus, beta and on from 1.36) with the message saying
    why, and the next claim gets the other device."""
    state = tmp_path / "devices.json"
    state.write_text(json.dumps({"devices": [{"id": "fake-0"}, {"id": "fake-1"}]}))
    with fake_driver(node, tmp_path, "--state-file", str(state)) as driver:
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 2)
        node.apply(template("first-fake", fake_class), template("healthy-fake", fake_class))
        try:
            node.run_pod("dra-holder", claims=[{"name": "dev", "resourceClaimTemplateName": "first-fake"}])
            (held,) = allocated_devices(node, "dra-holder")
            (other,) = {"fake-0", "fake-1"} - {held}
            sick = {"id": held, "health": "Unhealthy", "health_message": "fan stopped"}
            state.write_text(json.dumps({"devices": [sick, {"id": other}]}))
            if node.minor >= 36:  # DRADeviceTaints: beta and on from 1.36, GA in 1.37
                wait_for(
                    f"a taint on {held}", lambda: published(node, FAKE_DRIVER).get(held, {}).get("taints")
                )

                def health() -> list[dict[str, Any]]:
                    statuses = node.get("pod", "dra-holder")["status"].get("containerStatuses", [])
                    return [
                        r
                        for s in statuses
                        for st in s.get("allocatedResourcesStatus") or []
                        for r in st.get("resources", [])
                        if r.get("health") == "Unhealthy"
                    ]

                (unhealthy,) = wait_for("the pod's allocatedResourcesStatus", health)
                # the kubelet names a DRA device by the CDI device ID the driver's prepare gave it
                claim_name = node.get("pod", "dra-holder")["status"]["resourceClaimStatuses"][0][
                    "resourceClaimName"
                ]
                uid = node.get("resourceclaim", claim_name)["metadata"]["uid"]
                assert unhealthy["resourceID"].startswith(f"k8s.{FAKE_DRIVER}/claim={uid}"), unhealthy
                # why, from the health stream's message (ResourceHealthStatusMessage: beta, on, 1.36)
                assert unhealthy.get("message") == "fan stopped", unhealthy
            else:  # the API server drops taints: devplug leaves the device out of its slices instead
                wait_for(f"{held} left out", lambda: set(published(node, FAKE_DRIVER)) == {other})
            node.run_pod("dra-healthy", claims=[{"name": "dev", "resourceClaimTemplateName": "healthy-fake"}])
            assert allocated_devices(node, "dra-healthy") == [other]
        finally:
            node.delete("pod", "dra-holder", wait=False)
            node.delete("pod", "dra-healthy")
            node.delete("pod", "dra-holder")
            node.delete("resourceclaimtemplate", "first-fake")
            node.delete("resourceclaimtemplate", "healthy-fake")
        assert driver.poll() is None, log_of(driver)


def test_a_selector_on_the_standard_numa_node_gets_the_devices_of_that_node(
    node: Node, tmp_path: Path, fake_class: str
) -> None:
    """Kubernetes' own `resource.kubernetes.io/numaNode` (KEP-6072, GA in 1.37) in a claim's CEL
    selector: the real scheduler gives the devices on that NUMA node only."""
    with fake_driver(node, tmp_path, "--numa-nodes", "2") as driver:
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
        assert {
            n: d["attributes"]["resource.kubernetes.io/numaNode"]
            for n, d in published(node, FAKE_DRIVER).items()
        } == {f"fake-{i}": {"int": i % 2} for i in range(4)}
        body = template("numa-one", fake_class, count=2)
        expression = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
        body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
            {"cel": {"expression": expression}}
        ]
        node.apply(body)
        try:
            node.run_pod("dra-numa", claims=[{"name": "dev", "resourceClaimTemplateName": "numa-one"}])
            assert sorted(allocated_devices(node, "dra-numa")) == ["fake-1", "fake-3"]
        finally:
            node.delete("pod", "dra-numa")
            node.delete("resourceclaimtemplate", "numa-one")
        assert driver.poll() is None, log_of(driver)


def test_the_kubelet_wipes_the_slices_of_a_driver_that_went(node: Node, tmp_path: Path) -> None:
    """As FakeKubelet does: not at once (a restarting driver keeps its pool), but within the
    kubelet's grace period (30 s) after the driver's registration socket went."""
    with fake_driver(node, tmp_path, "--driver-name", "gone.example.com") as driver:
        wait_for("the driver's slices", lambda: len(published(node, "gone.example.com")) == 4)
        # the kubelet wipes only for a driver it registered (a socket gone before is forgotten)
        wait_for("the kubelet's registration", lambda: events(driver, "registered") >= 1)
        assert stop_process(driver) == 0, log_of(driver)
    assert slices(node, "gone.example.com"), "wiped at once"
    wait_for("the slices wiped by the kubelet", lambda: not slices(node, "gone.example.com"), timeout=90)


def nvidia_driver(node: Node, tmp: Path, model: str) -> AbstractContextManager[Popen[bytes]]:
    return plugin_process(
        node,
        tmp,
        "devplug-nvidia",
        *node.dra_flags(),
        "--fake-nvml",
        model,
        "--nvidia-cdi-hook-path",
        str(noop_hook(tmp)),
        "--log-format",
        "json",
    )


@pytest.fixture
def nvidia_classes(node: Node) -> None:
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "nvidia-dra" / "driver" / "deviceclasses.yaml"))


def test_nvidia_dra_gpu_claim_reaches_the_container(node: Node, tmp_path: Path, nvidia_classes: None) -> None:
    with nvidia_driver(node, tmp_path, "dgx-a100") as driver:
        wait_for("gpu.nvidia.com slices", lambda: len(published(node, "gpu.nvidia.com")) == 8, timeout=90)
        node.apply(template("one-gpu", "gpu.nvidia.com"))
        try:
            node.run_pod("dra-gpu", claims=[{"name": "dev", "resourceClaimTemplateName": "one-gpu"}])
            (device,) = allocated_devices(node, "dra-gpu")
            minor = device.removeprefix("gpu-")
            nodes = device_nodes(node.logs("dra-gpu", "PATH="))
            assert f"nvidia{minor}" in nodes, nodes
            assert not {n for n in nodes if n.startswith("nvidia") and n[6:].isdigit()} - {f"nvidia{minor}"}
        finally:
            node.delete("pod", "dra-gpu")
            node.delete("resourceclaimtemplate", "one-gpu")
        wait_for("the GPU claim's spec removed", lambda: not claim_specs(node, "gpu.nvidia.com"))
        assert driver.poll() is None, log_of(driver)


def test_nvidia_dra_mig_device_through_the_mig_class(
    node: Node, tmp_path: Path, nvidia_classes: None
) -> None:
    with nvidia_driver(node, tmp_path, "mig-mixed") as driver:

        def migs() -> dict[str, Any]:
            return {
                n: d
                for n, d in published(node, "gpu.nvidia.com").items()
                if d.get("attributes", {}).get("type", {}).get("string") == "mig"
            }

        wait_for("MIG devices in the slices", migs, timeout=90)
        node.apply(template("one-mig", "mig.nvidia.com"))
        try:
            node.run_pod("dra-mig", claims=[{"name": "dev", "resourceClaimTemplateName": "one-mig"}])
            (device,) = allocated_devices(node, "dra-mig")
            assert device in migs()
        finally:
            node.delete("pod", "dra-mig")
            node.delete("resourceclaimtemplate", "one-mig")
        assert driver.poll() is None, log_of(driver)


@pytest.mark.before_device_plugins  # no nvidia.com/gpu device plugin on the node before (conftest)
def test_an_unchanged_pod_asking_nvidia_gpu_is_served_through_dra(
    node: Node, tmp_path: Path, nvidia_classes: None
) -> None:
    if node.minor < 36:
        pytest.skip(f"DRAExtendedResource is alpha and off in 1.{node.minor} (beta and on from 1.36)")
    # deploy/nvidia-dra/extended-resource's patch, on the class alone (its kustomization also
    # deploys the driver's DaemonSet, which this test runs on the host instead)
    node.kubectl(
        "patch",
        "deviceclass",
        "gpu.nvidia.com",
        "--type",
        "json",
        "--patch-file",
        str(ROOT / "deploy" / "nvidia-dra" / "extended-resource" / "extended-resource-name.yaml"),
    )
    try:
        with nvidia_driver(node, tmp_path, "dgx-a100") as driver:
            wait_for("gpu.nvidia.com slices", lambda: len(published(node, "gpu.nvidia.com")) == 8, timeout=90)
            try:
                node.run_pod("ext-gpu", resources={"nvidia.com/gpu": 1})
                status = node.get("pod", "ext-gpu")["status"]
                assert status.get("extendedResourceClaimStatus"), status
                nodes = device_nodes(node.logs("ext-gpu", "PATH="))
                assert len({n for n in nodes if n.startswith("nvidia") and n[6:].isdigit()}) == 1, nodes
            finally:
                node.delete("pod", "ext-gpu")
            assert driver.poll() is None, log_of(driver)
    finally:
        node.kubectl("replace", "-f", str(ROOT / "deploy" / "nvidia-dra" / "driver" / "deviceclasses.yaml"))
