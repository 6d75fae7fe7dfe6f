"""deploy/nvidia-dra: devplug-nvidia served as the DRA driver gpu.nvidia.com, with its RBAC,
NVIDIA's DeviceClasses, the extended-resource overlay, the device-plugin overlay and examples.

Every object validates offline (strictly) against Kubernetes 1.34 (the first with
resource.k8s.io/v1, and with DeviceClass.spec.extendedResourceName) and the newest schemas
kubernetes-validate bundles; the DaemonSet's arguments and environment parse with devplug-nvidia's
own settings loader, and its mounts are the directories those settings name; the ClusterRole is
deploy/dra's; the DeviceClasses carry NVIDIA's selector strings, and those selectors, evaluated
with a CEL interpreter, pick the right devices of the slices the driver publishes for fake
machines; on any GPU node exactly one of the device-plugin and DRA DaemonSets runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug import Settings
from devplug.testing import FakeKubeAPI, serving_dra
from devplug_nvidia.config import DRA_ENV_NAMES, ENV_NAMES, NvidiaSettings, load_nvidia_settings
from devplug_nvidia.discovery import GPU_RESOURCE
from devplug_nvidia.dra import DRIVER_NAME, NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from tests.deploy.kustomize_lite import object_id, render
from tests.deploy.test_manifests_dra import RBAC_RULES, role_rules

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TOP = "nvidia-dra"
DRIVER_KUSTOMIZATION = "nvidia-dra/driver"
EXAMPLE = "nvidia-dra/example"
EXTENDED = "nvidia-dra/extended-resource"
EXTENDED_EXAMPLE = "nvidia-dra/extended-resource/example"
DEVICE_PLUGIN = "nvidia-dra/device-plugin"
KUSTOMIZATIONS = (TOP, DRIVER_KUSTOMIZATION, EXAMPLE, EXTENDED, EXTENDED_EXAMPLE, DEVICE_PLUGIN)

FIRST_WITH_RESOURCE_V1 = "1.34.0"
"""resource.k8s.io/v1 and DeviceClass.spec.extendedResourceName (feature gate DRAExtendedResource,
alpha in 1.34) are both in the schemas from Kubernetes 1.34 on."""
KUBERNETES_VERSIONS = (FIRST_WITH_RESOURCE_V1, kubernetes_validate.latest_version())

DAEMONSET = "devplug-nvidia-dra"
DEVICE_PLUGIN_DAEMONSET = "devplug-nvidia"
NAMESPACE = "kube-system"
KUBELET_ROOT = "/var/lib/kubelet"
API_LABEL = "devplug/nvidia-api"
FAKE_POOL_LABEL = "devplug/fake-gpu-pool"
GPU_LABELS = ("nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present")
METRICS_PORT = 8080
EXTENDED_RESOURCE = "nvidia.com/gpu"

NVIDIA_CLASSES = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",  # noqa: E501 - NVIDIA's string, whole
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",  # noqa: E501 - NVIDIA's string, whole
}
"""NVIDIA's selectors (dra-driver-nvidia-gpu v0.4.1, deployments/helm templates deviceclass-*.yaml)."""

DOWNWARD_API = {"NODE_NAME": "spec.nodeName", "POD_UID": "metadata.uid"}
NODE = "node-a"
POD_UID = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"


def _objects(name: str) -> list[dict[str, Any]]:
    return render(DEPLOY / name)


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return obj


def _pod(objects: list[dict[str, Any]], name: str = DAEMONSET) -> dict[str, Any]:
    spec: dict[str, Any] = _one(objects, "DaemonSet", name)["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return container


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DEVPLUG_*, NVIDIA variable, NODE_NAME or POD_UID of this process leaks into a parse."""
    nvidia = {v for names in (*ENV_NAMES.values(), *DRA_ENV_NAMES.values()) for v in names}
    for name in os.environ:
        if name.startswith("DEVPLUG_") or name in DOWNWARD_API or name in nvidia:
            monkeypatch.delenv(name)
    return monkeypatch


def _settings(objects: list[dict[str, Any]], env: pytest.MonkeyPatch) -> NvidiaSettings:
    """The DaemonSet's container as devplug-nvidia parses it, on node NODE in pod POD_UID."""
    container = _container(_pod(objects))
    assert container["command"] == ["devplug-nvidia"]
    values = {"spec.nodeName": NODE, "metadata.uid": POD_UID}
    for variable in container.get("env", []):
        if "value" in variable:
            env.setenv(variable["name"], variable["value"])
        else:
            env.setenv(variable["name"], values[variable["valueFrom"]["fieldRef"]["fieldPath"]])
    return load_nvidia_settings(container["args"], prog="devplug-nvidia")


def _mount(pod: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mount at ``path`` and its volume."""
    mounts = [m for m in _container(pod)["volumeMounts"] if m["mountPath"] == path]
    assert mounts, f"nothing is mounted at {path}"
    (mount,) = mounts
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def _host_mount(pod: dict[str, Any], path: Path | str, *, kind: str) -> None:
    """A writable mount at ``path`` of the host's directory of the same path."""
    mount, volume = _mount(pod, str(path))
    assert volume.get("hostPath") == {"path": str(path), "type": kind}, volume
    assert not mount.get("readOnly"), f"{path} is written to"


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


def test_the_schemas_check_the_extended_resource_name() -> None:
    """Proof that the 1.34 validation is not vacuous for the overlay's one new field."""
    device_class = _one(_objects(EXTENDED), "DeviceClass", "gpu.nvidia.com")
    assert device_class["spec"]["extendedResourceName"] == EXTENDED_RESOURCE
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(device_class, "1.33.0", strict=True)
    misspelt = json.loads(json.dumps(device_class))
    misspelt["spec"]["extendedResourceNames"] = misspelt["spec"].pop("extendedResourceName")
    for version in KUBERNETES_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(misspelt, version, strict=True)


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


def test_the_top_kustomization_is_the_driver() -> None:
    assert _objects(TOP) == _objects(DRIVER_KUSTOMIZATION)


def test_driver_objects_are_labelled_and_in_kube_system() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == [
        ("ClusterRole", DAEMONSET),
        ("ClusterRoleBinding", DAEMONSET),
        ("DaemonSet", DAEMONSET),
        ("DeviceClass", "gpu.nvidia.com"),
        ("DeviceClass", "mig.nvidia.com"),
        ("ServiceAccount", DAEMONSET),
    ]
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "devplug", object_id(obj)
        if obj["kind"] in ("DaemonSet", "ServiceAccount"):
            assert obj["metadata"]["namespace"] == NAMESPACE, object_id(obj)
        else:  # cluster-scoped
            assert "namespace" not in obj["metadata"], object_id(obj)


def test_image_command_and_runtime_class_are_the_device_plugins() -> None:
    """The same image conventions as deploy/base/nvidia-daemonset.yaml."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pod = _pod(_objects(DRIVER_KUSTOMIZATION))
    base = _pod(render(DEPLOY / "base"), DEVICE_PLUGIN_DAEMONSET)
    container, base_container = _container(pod), _container(base)
    assert container["image"] == f"devplug:{project['version']}" == base_container["image"]
    assert container["command"] == base_container["command"] == ["devplug-nvidia"]
    assert container["command"][0] in project["scripts"]
    assert container["imagePullPolicy"] == base_container["imagePullPolicy"]
    assert pod["runtimeClassName"] == base["runtimeClassName"] == "nvidia"
    assert pod["tolerations"] == base["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"


# -- the DaemonSet against devplug-nvidia's settings --------------------------------------------


def test_daemonset_flags_parse_as_nvidias_dra_driver(clean_env: pytest.MonkeyPatch) -> None:
    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    assert settings.api == "dra"
    assert settings.driver_name == DRIVER_NAME == "gpu.nvidia.com"
    assert settings.node_name == NODE
    assert settings.pod_uid == POD_UID
    assert settings.kubeconfig is None  # in-cluster: the pod's service account
    assert str(settings.kubelet_root) == KUBELET_ROOT
    assert settings.kubelet_root == Settings().kubelet_root
    assert settings.cdi_dir == Settings().cdi_dir  # NVIDIA's chart: CDI_ROOT=/var/run/cdi
    assert settings.driver_root == "/"  # NVIDIA_DRIVER_ROOT, as in NVIDIA's chart
    assert settings.driver_root_ctr_path == "/driver-root"
    assert settings.fake_nvml is None
    assert settings.metrics_address == f"0.0.0.0:{METRICS_PORT}"


def test_downward_api_gives_node_name_and_pod_uid() -> None:
    container = _container(_pod(_objects(DRIVER_KUSTOMIZATION)))
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e
    }
    assert fields == DOWNWARD_API


def test_mounts_are_the_settings_directories(clean_env: pytest.MonkeyPatch) -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    pod = _pod(objects)
    settings = _settings(objects, clean_env)
    assert settings.driver_name is not None
    data_dir = settings.dra_plugins_dir / settings.driver_name
    assert str(data_dir) == f"{KUBELET_ROOT}/plugins/{DRIVER_NAME}"
    # The kubelet's directories and the CDI directory, at their host paths.
    _host_mount(pod, settings.plugins_registry_dir, kind="Directory")
    _host_mount(pod, data_dir, kind="DirectoryOrCreate")
    # MPS daemons' tmpfs mounts under mps/ must reach the host (privileged containers only).
    assert _mount(pod, str(data_dir))[0]["mountPropagation"] == "Bidirectional"
    _host_mount(pod, settings.cdi_dir, kind="DirectoryOrCreate")
    # The driver root (host path --driver-root) where the settings look for it in the container.
    mount, volume = _mount(pod, settings.driver_root_ctr_path)
    assert volume["hostPath"] == {"path": settings.driver_root, "type": "Directory"}
    assert mount["readOnly"] is True
    assert mount["mountPropagation"] == "HostToContainer"
    # The device nodes: the dev root is the driver root, /, and a privileged container sees the
    # host's nodes in its own /dev, so the paths it finds are the host's.
    assert settings.effective_dev_root == "/"
    # Nothing else from the host: not the device-plugin directory (this node serves its GPUs
    # through DRA only), not /proc (the MIG capability files are the kernel's, in every /proc),
    # not /dev (see above).
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        str(settings.plugins_registry_dir),
        str(data_dir),
        str(settings.cdi_dir),
        settings.driver_root,
    }
    assert len(_container(pod)["volumeMounts"]) == 4
    assert not any(m["mountPath"].startswith(("/proc", "/dev")) for m in _container(pod)["volumeMounts"])


def test_sockets_and_checkpoint_lie_in_the_mounted_directories(clean_env: pytest.MonkeyPatch) -> None:
    from devplug.dra import DraDriver

    settings = _settings(_objects(DRIVER_KUSTOMIZATION), clean_env)
    driver = DraDriver([NvidiaDraPlugin([], settings, driver=DRIVER_NAME)], settings)
    assert driver.driver == DRIVER_NAME
    assert driver.data_dir == settings.dra_plugins_dir / DRIVER_NAME
    assert driver.dra_socket.parent == driver.data_dir
    assert driver.checkpoint.path.parent.parent == driver.data_dir  # state/, under the mount
    assert driver.registration_socket.parent == settings.plugins_registry_dir
    assert driver.dra_socket.name == f"dra-{POD_UID}.sock"
    assert driver.registration_socket.name == f"{DRIVER_NAME}-{POD_UID}-reg.sock"


def test_pod_runs_privileged_with_its_service_account() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    pod = _pod(objects)
    container = _container(pod)
    security = container["securityContext"]
    assert security["privileged"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (0, 0)
    assert security["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == _one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": METRICS_PORT}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert (get["path"], ports[get["port"]]) == (path, METRICS_PORT)


def test_rolling_update_surges_only_with_per_pod_sockets() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    strategy = _one(objects, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "POD_UID" in {e["name"] for e in _container(_pod(objects))["env"]}


# -- RBAC -----------------------------------------------------------------------------------------


def test_cluster_role_is_the_dra_drivers_of_deploy_dra() -> None:
    """The same runtime, so the same requests: exactly deploy/dra's rules (dra.md §6)."""
    # deploy/dra's rules (as shipped: role_rules reads them), the per-driver one naming NVIDIA's driver.
    theirs = {(g, r, DRIVER_NAME if n else n): v for (g, r, n), v in role_rules(_objects("dra")).items()}
    assert role_rules(_objects(DRIVER_KUSTOMIZATION)) == theirs
    assert theirs == {(g, r, DRIVER_NAME if n else n): v for (g, r, n), v in RBAC_RULES.items()}


def test_cluster_role_binding_binds_the_daemonsets_account() -> None:
    objects = _objects(DRIVER_KUSTOMIZATION)
    binding, role = _one(objects, "ClusterRoleBinding"), _one(objects, "ClusterRole")
    account = _one(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]


# -- DeviceClasses --------------------------------------------------------------------------------


def _classes(name: str = DRIVER_KUSTOMIZATION) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _objects(name) if o["kind"] == "DeviceClass"}


def test_device_classes_have_nvidias_selectors() -> None:
    classes = _classes()
    assert {
        name: [s["cel"]["expression"] for s in c["spec"]["selectors"]] for name, c in classes.items()
    } == {name: [expression] for name, expression in NVIDIA_CLASSES.items()}
    for device_class in classes.values():
        assert set(device_class["spec"]) == {"selectors"}  # no config, as NVIDIA's


def test_extended_resource_overlay_changes_only_the_gpu_class() -> None:
    base = {object_id(o): o for o in _objects(DRIVER_KUSTOMIZATION)}
    overlay = {object_id(o): o for o in _objects(EXTENDED)}
    assert set(base) == set(overlay)
    changed = [key for key in base if base[key] != overlay[key]]
    assert changed == [("resource.k8s.io/v1", "DeviceClass", "", "gpu.nvidia.com")]
    (key,) = changed
    spec = dict(overlay[key]["spec"])
    assert spec.pop("extendedResourceName") == EXTENDED_RESOURCE == GPU_RESOURCE
    assert spec == base[key]["spec"]


def _cel_device(device: dict[str, Any], driver: str) -> dict[str, Any]:
    """A published device as CEL sees it: ``device.driver``, ``device.attributes[domain][name]``
    (unqualified names in the driver's domain), ``device.capacity[domain][name]``."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.get("attributes", {}).items():
        domain, _, short = name.rpartition("/")
        ((_, item),) = value.items()  # {"string": ...}, {"int": ...}, {"bool": ...}, {"version": ...}
        attributes.setdefault(domain or driver, {})[short] = item
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in device.get("capacity", {}).items():
        domain, _, short = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[short] = value["value"]
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


async def _published(model: str, short_dir: Path) -> dict[str, Any]:
    """The ResourceSlice the driver publishes for the fake machine ``model``."""
    root = write_root(MODELS[model], short_dir / "root")
    settings = NvidiaSettings(driver_root=str(root), driver_name=DRIVER_NAME)
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(MODELS[model]), sysfs=root / "sys", proc=root / "proc"
    )
    async with FakeKubeAPI() as api, serving_dra(plugin, api, short_dir / "k", node_name=NODE):
        (published,) = await api.wait_for_slices(node=NODE, driver=DRIVER_NAME, count=1, timeout=15)
    return published


EXPECTED_GPUS = {"dgx-a100": [f"gpu-{i}" for i in range(8)], "mig-mixed": ["gpu-4"]}
"""The full GPUs published per machine; every other device is a MIG device (dgx-a100 has none;
mig-mixed has GPU 4 without MIG mode and the MIG devices of the others)."""


def test_selectors_use_attribute_names_the_driver_publishes(tmp_path: Path) -> None:
    """Without a CEL interpreter: the class names, the driver and the `type` attribute that the
    selectors use are what the driver publishes (NvidiaDraPlugin's devices, fake mig-mixed)."""
    root = write_root(MODELS["mig-mixed"], tmp_path / "root")
    settings = NvidiaSettings(driver_root=str(root), driver_name=DRIVER_NAME)
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(MODELS["mig-mixed"]), sysfs=root / "sys", proc=root / "proc"
    )
    types = {str(d.attributes["type"]) for d in plugin.devices}
    assert types == {"gpu", "mig"}
    for name, expression in NVIDIA_CLASSES.items():
        kind = name.split(".")[0]
        assert expression == (
            f"device.driver == '{plugin.driver}' && device.attributes['{plugin.driver}'].type == '{kind}'"
        )


@pytest.mark.anyio
@pytest.mark.parametrize("model", sorted(EXPECTED_GPUS))
async def test_the_classes_select_the_published_gpus_and_mig_devices(model: str, short_dir: Path) -> None:
    celpy = pytest.importorskip("celpy", reason="cel-python is in the dev extra: pip install -e '.[dev]'")
    published = await _published(model, short_dir)
    driver = published["spec"]["driver"]
    devices = published["spec"]["devices"]
    names = [d["name"] for d in devices]
    environment = celpy.Environment()
    selected: dict[str, list[str]] = {}
    for class_name, device_class in _classes(EXTENDED).items():
        (selector,) = device_class["spec"]["selectors"]
        program = environment.program(environment.compile(selector["cel"]["expression"]))
        selected[class_name] = [
            d["name"]
            for d in devices
            if program.evaluate(celpy.json_to_cel({"device": _cel_device(d, driver)}))
        ]
        # Another driver's device of the same shape is never selected.
        other = _cel_device(devices[0], "gpu.example.com")
        assert not bool(program.evaluate(celpy.json_to_cel({"device": other})))
    assert selected["gpu.nvidia.com"] == EXPECTED_GPUS[model]
    migs = [n for n in names if n not in EXPECTED_GPUS[model]]
    assert all("-mig-" in n for n in migs)
    assert len(migs) == (0 if model == "dgx-a100" else 14)
    assert selected["mig.nvidia.com"] == migs


# -- examples -------------------------------------------------------------------------------------


def test_example_claims_a_gpu_of_the_class() -> None:
    objects = _objects(EXAMPLE)
    template, pod = _one(objects, "ResourceClaimTemplate"), _one(objects, "Pod")
    assert template["metadata"]["namespace"] == pod["metadata"]["namespace"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] in _classes()
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]
    assert "nvidia-smi" in " ".join(container["command"])


def test_extended_resource_example_is_an_unchanged_gpu_pod() -> None:
    pod = _one(_objects(EXTENDED_EXAMPLE), "Pod")
    assert "resourceClaims" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"limits": {EXTENDED_RESOURCE: 1}}
    names = {c["spec"].get("extendedResourceName") for c in _classes(EXTENDED).values()}
    assert EXTENDED_RESOURCE in names


# -- one API per node -----------------------------------------------------------------------------


def _expression_matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} is not handled here")


def _runs_on(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's pod may run on a node with ``labels`` (nodeSelector and the
    required node affinity, as the DaemonSet controller decides it)."""
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return any(all(_expression_matches(e, labels) for e in term["matchExpressions"]) for term in terms)


NODE_KINDS = {
    "gpu by label": {"nvidia.com/gpu.present": "true"},
    "gpu by NFD": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    "gpu by both": {"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"},
}


@pytest.mark.parametrize("api", [None, "dra", "device-plugin"])
@pytest.mark.parametrize("kind", sorted(NODE_KINDS))
def test_exactly_one_gpu_daemonset_runs_on_each_gpu_node(kind: str, api: str | None) -> None:
    labels = dict(NODE_KINDS[kind])
    if api is not None:
        labels[API_LABEL] = api
    dra = _runs_on(_pod(_objects(DRIVER_KUSTOMIZATION)), labels)
    device_plugin = _runs_on(_pod(_objects(DEVICE_PLUGIN), DEVICE_PLUGIN_DAEMONSET), labels)
    assert (dra, device_plugin) == ((True, False) if api == "dra" else (False, True))
    # Neither on a node of the fake GPU pool, nor on a node without a GPU.
    fake = {**labels, FAKE_POOL_LABEL: "true"}
    assert not _runs_on(_pod(_objects(DRIVER_KUSTOMIZATION)), fake)
    assert not _runs_on(_pod(_objects(DEVICE_PLUGIN), DEVICE_PLUGIN_DAEMONSET), fake)
    plain = {k: v for k, v in labels.items() if k not in GPU_LABELS}
    assert not _runs_on(_pod(_objects(DRIVER_KUSTOMIZATION)), plain)


def test_device_plugin_overlay_changes_only_the_affinity() -> None:
    base = {object_id(o): o for o in render(DEPLOY / "base")}
    overlay = {object_id(o): o for o in _objects(DEVICE_PLUGIN)}
    assert set(base) == set(overlay)
    changed = [key for key in base if base[key] != overlay[key]]
    assert changed == [("apps/v1", "DaemonSet", NAMESPACE, DEVICE_PLUGIN_DAEMONSET)]
    (key,) = changed
    before = json.loads(json.dumps(base[key]))
    after = json.loads(json.dumps(overlay[key]))
    affinity = "affinity"
    before["spec"]["template"]["spec"].pop(affinity)
    terms = after["spec"]["template"]["spec"].pop(affinity)["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert before == after
    for term in terms:
        assert term["matchExpressions"][-1] == {"key": API_LABEL, "operator": "NotIn", "values": ["dra"]}
