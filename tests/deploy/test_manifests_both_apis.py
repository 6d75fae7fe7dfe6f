"""deploy/dra-both-apis: deploy/dra serving both APIs from one process on each node."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug_fake import FakeSettings
from tests.deploy.kustomize_lite import object_id, render
from tests.deploy.test_manifests_dra import KUBERNETES_VERSIONS, NODE, POD_UID, RBAC_RULES, role_rules

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = "dra-both-apis"


def _objects() -> list[dict[str, Any]]:
    return render(DEPLOY / NAME)


def _by(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _settings(objects: list[dict[str, Any]], env: pytest.MonkeyPatch) -> FakeSettings:
    from devplug.settings import load_settings

    (container,) = _by(objects, "DaemonSet", "devplug-fake-dra")["spec"]["template"]["spec"]["containers"]
    for name in [n for n in __import__("os").environ if n.startswith("DEVPLUG_")]:
        env.delenv(name)
    env.setenv("NODE_NAME", NODE)
    env.setenv("POD_UID", POD_UID)
    return load_settings(FakeSettings, container["args"])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_objects_validate_against_the_kubernetes_schemas(version: str) -> None:
    for obj in _objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{object_id(obj)} against {version}: {exc.message}")


def test_renderer_agrees_with_kubectl_kustomize() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: rendered by tests/deploy/kustomize_lite.py only")
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / NAME)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    theirs = {object_id(o): json.dumps(o, sort_keys=True) for o in yaml.safe_load_all(result.stdout) if o}
    assert {object_id(o): json.dumps(o, sort_keys=True) for o in _objects()} == theirs


def test_the_daemonset_serves_both_apis_with_the_kubelet_directories_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = _objects()
    settings = _settings(objects, monkeypatch)
    assert settings.api == "device-plugin,dra"
    pod = _by(objects, "DaemonSet", "devplug-fake-dra")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    # Each kubelet directory at its host path: the device-plugin socket, and pod-resources.
    assert mounts[str(settings.device_plugin_dir)] == str(settings.device_plugin_dir)
    assert mounts[str(settings.pod_resources_socket.parent)] == str(settings.pod_resources_socket.parent)
    assert mounts[str(settings.plugins_registry_dir)] == str(settings.plugins_registry_dir)


def test_one_pod_per_node_at_a_time() -> None:
    strategy = _by(_objects(), "DaemonSet", "devplug-fake-dra")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_rbac_adds_only_reading_every_claim() -> None:
    objects = _objects()
    driver_role = [
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "devplug-fake-dra"
    ]
    assert role_rules(driver_role) == RBAC_RULES
    claims = [
        o
        for o in objects
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "devplug-fake-dra-claims"
    ]
    assert role_rules(claims) == {("resource.k8s.io", "resourceclaims", ""): {"list", "watch"}}
    binding = _by(objects, "ClusterRoleBinding", "devplug-fake-dra-claims")
    assert binding["roleRef"]["name"] == "devplug-fake-dra-claims"
    account = _by(objects, "ServiceAccount", "devplug-fake-dra")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "devplug-fake-dra", "namespace": account["metadata"]["namespace"]}
    ]
