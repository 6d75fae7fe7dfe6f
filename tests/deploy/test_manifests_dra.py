"""deploy/dra: devplug-fake served as a DRA driver, with its RBAC, DeviceClass and an example claim.

The same checks as test_manifests.py, for resource.k8s.io/v1 objects: every object validates
offline (strictly) against the first Kubernetes with resource.k8s.io/v1 (1.34) and the newest
schemas kubernetes-validate bundles; the DaemonSet's arguments and downward-API variables parse
with devplug-fake's own settings loader, and its mounts are the directories those settings
name, at the same path as on the host (the kubelet opens the DRA socket at the path the driver
gives it); the ClusterRole has exactly the verbs a DRA driver uses; the DeviceClass, the claim
template and the pod name the driver, the class and the claim that the others define.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug import Settings, load_settings
from devplug_fake import FakePlugin, FakeSettings
from tests.deploy.kustomize_lite import object_id, render

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DRIVER_KUSTOMIZATION = "dra"
EXAMPLE_KUSTOMIZATION = "dra/example"
KUSTOMIZATIONS = (DRIVER_KUSTOMIZATION, EXAMPLE_KUSTOMIZATION)

FIRST_WITH_RESOURCE_V1 = "1.34.0"
"""resource.k8s.io/v1 (DRA GA) is served from Kubernetes 1.34 on; older schemas lack it."""
KUBERNETES_VERSIONS = (FIRST_WITH_RESOURCE_V1, kubernetes_validate.latest_version())

DAEMONSET = "devplug-fake-dra"
DRIVER = "fake.example.com"
NAMESPACE = "kube-system"
KUBELET_ROOT = "/var/lib/kubelet"
POOL_LABEL = "devplug/fake-dra-pool"
METRICS_PORT = 8080
METRICS_ADDRESS = f"0.0.0.0:{METRICS_PORT}"

RBAC_RULES = {
    ("resource.k8s.io", "resourceslices", ""): {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
    },
    ("resource.k8s.io", "resourceclaims", ""): {"get"},
    ("resource.k8s.io", "resourceclaims/status", ""): {"update", "patch"},
    ("resource.k8s.io", "resourceclaims/driver", "fake.example.com"): {
        "associated-node:update",
        "associated-node:patch",
    },
    ("", "nodes", ""): {"get"},
}
"""dra.md §6: the slices of the node; the claim read at prepare; the claim's status.devices
written with what the prepared devices report (and, from 1.36, the per-driver check of those
writes, for this driver's name only); the Node, for the owner reference."""

DOWNWARD_API = {"NODE_NAME": "spec.nodeName", "POD_UID": "metadata.uid"}
NODE = "node-a"
POD_UID = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"


def _objects(name: str) -> list[dict[str, Any]]:
    return render(DEPLOY / name)


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    daemonset = _one(objects, "DaemonSet")
    assert daemonset["metadata"]["name"] == DAEMONSET
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return container


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DEVPLUG_*, NODE_NAME or POD_UID of this process leaks into a parse."""
    for name in os.environ:
        if name.startswith("DEVPLUG_") or name in DOWNWARD_API:
            monkeypatch.delenv(name)
    return monkeypatch


def _settings(objects: list[dict[str, Any]], env: pytest.MonkeyPatch) -> FakeSettings:
    """The DaemonSet's container as devplug-fake parses it, on node NODE in pod POD_UID."""
    container = _container(_pod(objects))
    assert container["command"] == ["devplug-fake"]
    values = {"spec.nodeName": NODE, "metadata.uid": POD_UID}
    for variable in container.get("env", []):
        if "value" in variable:
            env.setenv(variable["name"], variable["value"])
        else:
            env.setenv(variable["name"], values[variable["valueFrom"]["fieldRef"]["fieldPath"]])
    return load_settings(FakeSettings, container["args"], prog="devplug-fake")


def _host_mount(pod: dict[str, Any], path: Path | str, *, kind: str) -> dict[str, Any]:
    """The mount at ``path``; its volume must be the host's directory of the same path."""
    mounts = [m for m in _container(pod)["volumeMounts"] if m["mountPath"] == str(path)]
    assert mounts, f"nothing is mounted at {path}"
    (mount,) = mounts
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume.get("hostPath") == {"path": str(path), "type": kind}, volume
    assert not mount.get("readOnly"), f"{path} is written to"
    return mount


# -- schemas and rendering ----------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_objects_validate_against_the_kubernetes_schemas(name: str, version: str) -> None:
    objects = _objects(name)
    assert objects
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {object_id(obj)} against {version}: {where}: {exc.message}")


def test_the_schemas_know_resource_v1_from_1_34_on() -> None:
    """Why 1.34 is the oldest version checked, and proof the validation is not vacuous."""
    device_class = _one(_objects(DRIVER_KUSTOMIZATION), "DeviceClass")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(device_class, "1.33.0", strict=True)
    # v1beta1's shape (deviceClassName directly on the request) is refused by v1's schema.
    template = copy.deepcopy(_one(_objects(EXAMPLE_KUSTOMIZATION), "ResourceClaimTemplate"))
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    request["deviceClassName"] = request.pop("exactly")["deviceClassName"]
    for version in KUBERNETES_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(template, version, strict=True)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renderer_agrees_with_kubectl_kustomize(name: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: rendered by tests/deploy/kustomize_lite.py only")
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / name)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr

    def canonical(objects: list[dict[str, Any]]) -> dict[tuple[str, ...], str]:
        return {object_id(o): json.dumps(o, sort_keys=True) for o in objects}

    theirs = [o for o in yaml.safe_load_all(result.stdout) if o is not None]
    assert canonical(_objects(name)) == canonical(theirs)


def test_driver_objects_are_labelled_and_in_kube_system() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "DeviceClass",
        "ServiceAccount",
    ]
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "devplug", object_id(obj)
        if obj["kind"] in ("DaemonSet", "ServiceAccount"):
            assert obj["metadata"]["namespace"] == NAMESPACE, object_id(obj)
        else:  # cluster-scoped
            assert "namespace" not in obj["metadata"], object_id(obj)


def test_image_and_command_are_the_projects() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    container = _container(_pod(_objects(DRIVER_KUSTOMIZATION)))
    assert container["image"] == f"devplug:{project['version']}"
    assert container["command"][0] in project["scripts"]


# -- the DaemonSet against devplug-fake's settings ----------------------------------------------


def test_daemonset_flags_parse_as_a_dra_driver(clean_env: pytest.MonkeyPatch) -> None:
    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    assert settings.api == "dra"
    assert settings.driver_name == DRIVER
    # The downward API's variables are the ones the settings read.
    assert settings.node_name == NODE
    assert settings.pod_uid == POD_UID
    assert settings.kubeconfig is None  # in-cluster: the pod's service account
    assert str(settings.kubelet_root) == KUBELET_ROOT
    assert settings.kubelet_root == Settings().kubelet_root
    assert settings.cdi_dir == Settings().cdi_dir
    plugins = [FakePlugin(r) for r in settings.resource_configs()]
    assert [p.resource_name for p in plugins] == ["example.com/fake"]
    assert settings.count == 8


def test_downward_api_gives_node_name_and_pod_uid() -> None:
    container = _container(_pod(_objects(DRIVER_KUSTOMIZATION)))
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e
    }
    assert fields == DOWNWARD_API


def test_mounts_are_the_settings_directories_at_their_host_paths(clean_env: pytest.MonkeyPatch) -> None:
    pod = _pod(_objects(DRIVER_KUSTOMIZATION))
    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    assert settings.driver_name is not None
    data_dir = settings.dra_plugins_dir / settings.driver_name
    assert str(data_dir) == f"{KUBELET_ROOT}/plugins/{DRIVER}"
    assert str(settings.plugins_registry_dir) == f"{KUBELET_ROOT}/plugins_registry"
    _host_mount(pod, settings.plugins_registry_dir, kind="Directory")
    _host_mount(pod, data_dir, kind="DirectoryOrCreate")
    _host_mount(pod, settings.cdi_dir, kind="DirectoryOrCreate")
    # Nothing else from the host, and in particular not the device-plugin directory: this node
    # serves these devices through DRA only.
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        str(settings.plugins_registry_dir),
        str(data_dir),
        str(settings.cdi_dir),
    }
    assert len(_container(pod)["volumeMounts"]) == 3


def test_sockets_and_checkpoint_lie_in_the_mounted_directories(clean_env: pytest.MonkeyPatch) -> None:
    """The driver's own paths (where it serves, what it tells the kubelet) are inside the mounts."""
    driver_module = pytest.importorskip("devplug._dra.driver", reason="the DRA driver runtime is not built")
    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    plugins = [FakePlugin(r) for r in settings.resource_configs()]
    driver = driver_module.DraDriver(plugins, settings)
    assert driver.driver == DRIVER
    assert driver.data_dir == settings.dra_plugins_dir / DRIVER
    assert driver.dra_socket.parent == driver.data_dir
    assert driver.checkpoint.path.parent.parent == driver.data_dir  # state/, under the mount
    assert driver.registration_socket.parent == settings.plugins_registry_dir
    # Per-pod names, for rolling updates; short enough not to be hashed.
    assert driver.dra_socket.name == f"dra-{POD_UID}.sock"
    assert driver.registration_socket.name == f"{DRIVER}-{POD_UID}-reg.sock"


def test_default_driver_name_is_the_one_passed(clean_env: pytest.MonkeyPatch) -> None:
    """--driver-name only spells out the default, so dropping the flag changes nothing."""
    names = pytest.importorskip("devplug._dra.names", reason="the DRA driver runtime is not built")
    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    assert names.default_driver_name(settings.resource) == DRIVER


def test_probes_and_metrics(clean_env: pytest.MonkeyPatch) -> None:
    container = _container(_pod(_objects(DRIVER_KUSTOMIZATION)))
    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    assert settings.metrics_address == METRICS_ADDRESS
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": METRICS_PORT}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert (get["path"], ports[get["port"]]) == (path, METRICS_PORT)


def test_pod_runs_privileged_with_its_service_account() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    pod = _pod(objects)
    security = _container(pod)["securityContext"]
    assert security["privileged"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (0, 0)
    assert security["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == _one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {POOL_LABEL: "true"}
    assert {"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_rolling_update_surges_only_with_per_pod_sockets() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    strategy = _one(objects, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    env = {e["name"] for e in _container(_pod(objects))["env"]}
    assert "POD_UID" in env  # two pods on one node need distinct socket names


# -- RBAC -----------------------------------------------------------------------------------------


def role_rules(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], set[str]]:
    """The ClusterRole of ``objects`` as (group, resource, name or "") → verbs, each once."""
    rules: dict[tuple[str, str, str], set[str]] = {}
    for rule in _one(objects, "ClusterRole")["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule  # no URLs
        assert len(set(rule["verbs"])) == len(rule["verbs"]), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    assert (group, resource, name) not in rules, f"{group}/{resource} in two rules"
                    rules[group, resource, name] = set(rule["verbs"])
    return rules


def test_cluster_role_has_exactly_the_verbs_a_dra_driver_uses() -> None:
    assert role_rules(_objects(DRIVER_KUSTOMIZATION)) == RBAC_RULES


def test_cluster_role_binding_binds_the_daemonsets_account() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    binding = _one(objects, "ClusterRoleBinding")
    role = _one(objects, "ClusterRole")
    account = _one(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert _pod(objects)["serviceAccountName"] == account["metadata"]["name"]


# -- DeviceClass and the example ------------------------------------------------------------------


def test_device_class_selects_the_driver_the_daemonset_serves(clean_env: pytest.MonkeyPatch) -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    settings = _settings(objects, clean_env)
    device_class = _one(objects, "DeviceClass")
    (selector,) = device_class["spec"]["selectors"]
    match = re.fullmatch(r'device\.driver == "([^"]+)"', selector["cel"]["expression"].strip())
    assert match, selector
    assert match.group(1) == settings.driver_name
    assert device_class["metadata"]["name"] == settings.driver_name


def test_example_claims_a_device_of_the_class() -> None:
    class_name = _one(_objects(DRIVER_KUSTOMIZATION), "DeviceClass")["metadata"]["name"]
    objects = _objects(EXAMPLE_KUSTOMIZATION)
    template = _one(objects, "ResourceClaimTemplate")
    pod = _one(objects, "Pod")
    assert template["metadata"]["namespace"] == pod["metadata"]["namespace"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == class_name
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]
    assert "env" in " ".join(container["command"])  # it prints what the claim's CDI spec set
    assert {"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
