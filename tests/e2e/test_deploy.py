"""deploy/ for real: the DaemonSets applied to the e2e node as shipped, with devplug's image.

The image is the project's Dockerfile built by buildah (`e2e/node image`: no registry, no Docker
engine) and imported into the node's containerd under the name the manifests use
(devplug:0.1.0). The drivers run as pods with their own ServiceAccount and RBAC and reach the API
server as any in-cluster client does (the kubernetes Service's address, which on this node is
the API server's own); their hostPath volumes name the standard kubelet and CDI paths, which are
the node's own in its mount namespace. Each test then serves a workload pod through the driver.

The NVIDIA DaemonSet needs a GPU; here it gets the fake NVML model dgx-a100 by an overlay that
changes only what a GPU-less machine needs: --fake-nvml, the driver root (a fake tree written on
the host, as NVIDIA_DRIVER_ROOT and the driver-root volume name it), a no-op CDI hook, and no
runtimeClassName (there is no NVIDIA container runtime).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.node_kit import ROOT, VENV_BIN, Node, device_nodes, noop_hook, wait_for
from tests.e2e.test_dra import claim_specs, published

pytestmark = pytest.mark.timeout(420)

NODE_SCRIPT = ROOT / "e2e" / "node"


@pytest.fixture(scope="module")
def image(node: Node) -> None:
    """devplug:0.1.0 built (cached by the sources' digest) and imported into the node."""
    res = subprocess.run(
        [str(NODE_SCRIPT), "image", "--run-dir", str(node.run)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def daemonset_ready(node: Node, name: str, timeout: float = 180) -> dict[str, object]:
    """The DaemonSet's one pod, once Ready (registered with the kubelet, slices published)."""

    def ready() -> dict[str, object] | None:
        pods = node.get("pods", namespace="kube-system")["items"]
        for pod in pods:
            if pod["metadata"].get("labels", {}).get("app.kubernetes.io/name") != name:
                continue
            conditions = pod["status"].get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return dict(pod)
        return None

    try:
        return wait_for(f"DaemonSet {name} Ready", ready, timeout)
    except AssertionError as exc:
        logs = node.kubectl("logs", "-n", "kube-system", f"ds/{name}", "--tail=20", check=False)
        described = node.kubectl("get", "events", "-n", "kube-system", check=False)
        raise AssertionError(f"{exc}\nlogs:\n{logs}\nevents:\n{described[-3000:]}") from None


def label(node: Node, *labels: str) -> None:
    node.kubectl("label", "node", node.name, "--overwrite", *labels)


def remove(node: Node, kustomization: Path, pods_named: str, labels: list[str]) -> None:
    """Delete what the kustomization made and wait until its pods are gone; labels off."""
    node.kubectl(
        "delete", "-k", str(kustomization), "--ignore-not-found", "--cascade=foreground", "--timeout=90s"
    )
    wait_for(
        f"{pods_named} pods gone",
        lambda: (
            not [
                p
                for p in node.get("pods", namespace="kube-system")["items"]
                if p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == pods_named
            ]
        ),
        timeout=90,
    )
    label(node, *(f"{key}-" for key in labels))


def driver_slices_gone(node: Node, driver: str) -> None:
    """No slice of `driver` left for the next test (a pod that stops keeps them, as it should)."""
    node.kubectl(
        "delete", "resourceslices", "--field-selector", f"spec.driver={driver}", "--ignore-not-found"
    )


def test_the_dra_daemonset_serves_the_example_pod(node: Node, image: None) -> None:
    deploy, example = ROOT / "deploy" / "dra", ROOT / "deploy" / "dra" / "example"
    label(node, "devplug/fake-dra-pool=true")
    try:
        node.kubectl("apply", "-k", str(deploy))
        pod = daemonset_ready(node, "devplug-fake-dra")
        assert pod["spec"]["serviceAccountName"] == "devplug-fake-dra"  # type: ignore[index]
        devices = published(node, "fake.example.com")
        assert sorted(devices) == [f"fake-{i}" for i in range(8)]
        node.kubectl("apply", "-k", str(example))
        try:
            node.wait_running("dra-fake-example", timeout=120)
            env = node.pod_env("dra-fake-example")
            (device,) = env["FAKE_VISIBLE_DEVICES"].split(",")
            assert device in devices
            assert claim_specs(node, "fake.example.com")  # the driver's CDI spec, in the node's CDI dir
        finally:
            node.kubectl("delete", "-k", str(example), "--ignore-not-found", "--timeout=90s")
        wait_for("the claim's CDI spec removed", lambda: not claim_specs(node, "fake.example.com"))
    finally:
        remove(node, deploy, "devplug-fake-dra", ["devplug/fake-dra-pool"])
        driver_slices_gone(node, "fake.example.com")


def nvidia_overlay(node: Node, tmp: Path) -> Path:
    """deploy/nvidia-dra with only what a machine without a GPU changes (see the module's doc)."""
    root = node.run / "fake-gpu-root"
    if not root.is_dir():
        subprocess.run(
            [str(VENV_BIN / "devplug-nvidia"), "fake-root", "dgx-a100", str(root)],
            check=True,
            capture_output=True,
        )
    hook = noop_hook(node.run)
    overlay = tmp / "nvidia-dra-fake"
    overlay.mkdir()
    base = os.path.relpath(ROOT / "deploy" / "nvidia-dra", overlay)
    patch = [
        {"op": "remove", "path": "/spec/template/spec/runtimeClassName"},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--fake-nvml=dgx-a100"},
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/args/-",
            "value": f"--nvidia-cdi-hook-path={hook}",
        },
        {"op": "test", "path": "/spec/template/spec/containers/0/env/2/name", "value": "NVIDIA_DRIVER_ROOT"},
        {"op": "replace", "path": "/spec/template/spec/containers/0/env/2/value", "value": str(root)},
        {"op": "test", "path": "/spec/template/spec/volumes/3/name", "value": "driver-root"},
        {"op": "replace", "path": "/spec/template/spec/volumes/3/hostPath/path", "value": str(root)},
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "patches": [
            {"target": {"kind": "DaemonSet", "name": "devplug-nvidia-dra"}, "patch": json.dumps(patch)}
        ],
    }
    (overlay / "kustomization.yaml").write_text(json.dumps(kustomization, indent=1))
    return overlay


def test_the_nvidia_dra_daemonset_serves_a_gpu_claim(node: Node, image: None, tmp_path: Path) -> None:
    overlay = nvidia_overlay(node, tmp_path)
    labels = ["devplug/nvidia-api", "nvidia.com/gpu.present"]
    label(node, "devplug/nvidia-api=dra", "nvidia.com/gpu.present=true")
    try:
        node.kubectl("apply", "-k", str(overlay))
        pod = daemonset_ready(node, "devplug-nvidia-dra")
        assert pod["spec"]["serviceAccountName"] == "devplug-nvidia-dra"  # type: ignore[index]
        devices = wait_for(
            "8 healthy GPUs published", lambda: (d := published(node, "gpu.nvidia.com")) and len(d) == 8 and d
        )
        assert not [name for name, d in devices.items() if d.get("taints")], devices
        node.kubectl("apply", "-f", str(ROOT / "deploy" / "nvidia-dra" / "example" / "claim-template.yaml"))
        try:
            node.run_pod(
                "ds-gpu", claims=[{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}], timeout=120
            )
            nodes = device_nodes(node.logs("ds-gpu", "PATH="))
            gpus = {n for n in nodes if n.startswith("nvidia") and n[6:].isdigit()}
            assert len(gpus) == 1, nodes
        finally:
            node.delete("pod", "ds-gpu")
            node.delete("resourceclaimtemplate", "single-gpu")
        wait_for("the GPU claim's spec removed", lambda: not claim_specs(node, "gpu.nvidia.com"))
    finally:
        remove(node, overlay, "devplug-nvidia-dra", labels)
        driver_slices_gone(node, "gpu.nvidia.com")


def test_the_device_plugin_daemonset_serves_a_pod(node: Node, image: None) -> None:
    deploy = ROOT / "deploy" / "base"
    label(node, "devplug/fake-gpu-pool=true")
    try:
        node.kubectl("apply", "-k", str(deploy))
        daemonset_ready(node, "devplug-fake")
        node.wait_allocatable("nvidia.com/gpu", 8, timeout=60)
        pods = node.get("pods", namespace="kube-system")["items"]
        names = {p["metadata"]["labels"].get("app.kubernetes.io/name") for p in pods}
        assert names == {"devplug-fake"}, names  # the NVIDIA DaemonSets stay off a fake-GPU node
        node.run_pod("ds-dp", resources={"nvidia.com/gpu": 2})
        try:
            env = node.pod_env("ds-dp")
            assert len(env["FAKE_VISIBLE_DEVICES"].split(",")) == 2, env
        finally:
            node.delete("pod", "ds-dp")
    finally:
        remove(node, deploy, "devplug-fake", ["devplug/fake-gpu-pool"])
    node.wait_allocatable("nvidia.com/gpu", 0, timeout=90)
