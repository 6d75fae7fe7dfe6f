"""deploy/: every kustomization renders, validates against the Kubernetes schemas offline, and says
what the programs expect (flags, paths, ports, config files).

Rendering is :mod:`tests.deploy.kustomize_lite` (pure Python, the subset deploy/ uses); where
``kubectl`` is installed its ``kustomize`` must produce the same objects. Validation is
kubernetes-validate's bundled JSON schemas, strict (unknown fields are errors). The containers'
arguments are parsed by the programs' own settings loaders, with the ConfigMaps they mount
written to a temporary directory, so a flag that does not exist, a bad value or a config file
that the strict loaders refuse fails here.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug import Settings, load_settings
from devplug_fake import FakePlugin, FakeSettings
from devplug_nvidia import labels
from devplug_nvidia._device_plugin._sharing import apply_sharing
from devplug_nvidia.config import ENV_NAMES, NvidiaSettings, load_nvidia_settings
from devplug_nvidia.discovery import discover
from devplug_nvidia.testing import fake_nvml, write_root
from tests.deploy.kustomize_lite import KUSTOMIZATION, object_id, render

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

METRICS_PORT = 8080
"""The one port the manifests use for metrics and probes (``--metrics-address``)."""
METRICS_ADDRESS = f"0.0.0.0:{METRICS_PORT}"
READYZ = "/readyz"
HEALTHZ = "/healthz"
NAMESPACE = "kube-system"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
K3S_KUBELET_ROOT = "/var/lib/rancher/k3s/agent/kubelet"
FAKE_POOL_LABEL = "devplug/fake-gpu-pool"
GPU_TAINT = "nvidia.com/gpu"
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
"""The oldest Kubernetes the manifests are checked against, and the newest schemas bundled."""

NVIDIA, LABELS, FAKE = "devplug-nvidia", "devplug-nvidia-labels", "devplug-fake"
PLUGINS = (NVIDIA, FAKE)


@dataclass(frozen=True)
class Layout:
    """What one kustomization must produce."""

    kubelet_root: str
    registration: str


LAYOUTS = {
    "base": Layout(DEFAULT_KUBELET_ROOT, "kubelet"),
    "overlays/k3s": Layout(K3S_KUBELET_ROOT, "kubelet"),
    "overlays/plugin-watcher": Layout(DEFAULT_KUBELET_ROOT, "watcher"),
}
OTHER_KUSTOMIZATIONS = ("runtimeclass",)
DRA_KUSTOMIZATIONS = ("dra", "dra/example", "dra-both-apis")
"""Checked in test_manifests_dra.py: resource.k8s.io/v1 objects, which need Kubernetes 1.34."""
NVIDIA_DRA_KUSTOMIZATIONS = (
    "nvidia-dra",
    "nvidia-dra/driver",
    "nvidia-dra/example",
    "nvidia-dra/extended-resource",
    "nvidia-dra/extended-resource/example",
    "nvidia-dra/device-plugin",
)
"""Checked in test_manifests_nvidia_dra.py."""


def _project() -> dict[str, Any]:
    """pyproject.toml's [project] table (tomllib: Python 3.11 and later)."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> tuple[str, Layout, list[dict[str, Any]]]:
    return request.param, LAYOUTS[request.param], render(DEPLOY / request.param)


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _pod(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _by_kind(objects, "DaemonSet")[name]["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return container


# -- the layout of deploy/ ----------------------------------------------------------------------


def test_every_kustomization_is_checked() -> None:
    found = {str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob(KUSTOMIZATION)}
    assert found == (
        set(LAYOUTS) | set(OTHER_KUSTOMIZATIONS) | set(DRA_KUSTOMIZATIONS) | set(NVIDIA_DRA_KUSTOMIZATIONS)
    )


def test_default_kubelet_root_is_the_settings_default() -> None:
    settings = Settings()
    assert str(settings.device_plugin_dir) == f"{DEFAULT_KUBELET_ROOT}/device-plugins"
    assert str(settings.plugins_registry_dir) == f"{DEFAULT_KUBELET_ROOT}/plugins_registry"
    assert settings.kubelet_socket_path == settings.device_plugin_dir / "kubelet.sock"


def test_probe_paths_are_the_ones_devplug_serves() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "devplug").rglob("*.py"))
    for path in (READYZ, HEALTHZ):
        assert f'"{path}"' in source, f"devplug serves no {path}"


@pytest.mark.parametrize("name", [*sorted(LAYOUTS), *OTHER_KUSTOMIZATIONS])
def test_objects_validate_against_the_kubernetes_schemas(name: str) -> None:
    objects = render(DEPLOY / name)
    assert objects
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{name}: {object_id(obj)} against {version}: {where}: {exc.message}")


@pytest.mark.parametrize("name", [*sorted(LAYOUTS), *OTHER_KUSTOMIZATIONS])
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
    assert canonical(render(DEPLOY / name)) == canonical(theirs)


def test_objects_are_namespaced_and_labelled(layout: tuple[str, Layout, list[dict[str, Any]]]) -> None:
    _, _, objects = layout
    for obj in objects:
        assert obj["metadata"]["namespace"] == NAMESPACE, object_id(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "devplug", object_id(obj)
    assert set(_by_kind(objects, "DaemonSet")) == {NVIDIA, LABELS, FAKE}


def test_images_and_commands_are_the_projects(layout: tuple[str, Layout, list[dict[str, Any]]]) -> None:
    _, _, objects = layout
    project = _project()
    for name in (NVIDIA, LABELS, FAKE):
        container = _container(_pod(objects, name))
        assert container["image"] == f"devplug:{project['version']}"
        assert container["command"][0] in project["scripts"]


# -- the plugin DaemonSets ----------------------------------------------------------------------


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["volumes"]}


def _mount(pod: dict[str, Any], path: Path | str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The container's mount at ``path`` and its volume (fails if there is none)."""
    mounts = [m for m in _container(pod)["volumeMounts"] if m["mountPath"] == str(path)]
    assert mounts, f"nothing is mounted at {path}"
    (mount,) = mounts
    return mount, _volumes(pod)[mount["name"]]


def _host_mount(pod: dict[str, Any], path: Path | str, host_path: str, *, kind: str) -> dict[str, Any]:
    mount, volume = _mount(pod, path)
    assert volume.get("hostPath") == {"path": host_path, "type": kind}, volume
    return mount


class _Mounted:
    """A container's ConfigMap mounts written under a temporary root, and its args pointed there."""

    def __init__(self, objects: list[dict[str, Any]], pod: dict[str, Any], root: Path) -> None:
        config_maps = _by_kind(objects, "ConfigMap")
        self.root = root
        self.prefixes: dict[str, str] = {}
        for mount in _container(pod)["volumeMounts"]:
            volume = _volumes(pod)[mount["name"]]
            if "configMap" not in volume:
                continue
            data = config_maps[volume["configMap"]["name"]]["data"]
            local = root / mount["mountPath"].lstrip("/")
            local.mkdir(parents=True)
            for key, text in data.items():
                (local / key).write_text(text)
            self.prefixes[mount["mountPath"].rstrip("/") + "/"] = str(local) + "/"

    def args(self, args: list[str]) -> list[str]:
        out = []
        for arg in args:
            local_arg = arg
            for prefix, local in self.prefixes.items():
                local_arg = local_arg.replace(prefix, local)
            out.append(local_arg)
        return out

    def container_path(self, path: Path | str) -> str:
        """A path this object made, as the container sees it."""
        text = str(path)
        for prefix, local in self.prefixes.items():
            if text.startswith(local):
                return prefix + text[len(local) :]
        raise AssertionError(f"{path} is not in a mounted ConfigMap")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No NVIDIA, gpu-feature-discovery or DEVPLUG_* variable of this process leaks into a parse."""
    names = {n for names in ENV_NAMES.values() for n in names}
    for name in os.environ:
        if name in names or name.startswith(("DEVPLUG_", "GFD_", "DP_")):
            monkeypatch.delenv(name)
    return monkeypatch


def _apply_env(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def _check_kubelet_mounts(pod: dict[str, Any], settings: Settings, layout: Layout) -> None:
    _host_mount(pod, settings.device_plugin_dir, f"{layout.kubelet_root}/device-plugins", kind="Directory")
    _host_mount(
        pod, settings.plugins_registry_dir, f"{layout.kubelet_root}/plugins_registry", kind="Directory"
    )
    assert settings.kubelet_socket_path.parent == settings.device_plugin_dir
    assert settings.registration == layout.registration
    # Watcher mode: an empty endpoint, which the kubelet resolves to where it found the socket
    # (the host path), so the container's path for the directory does not matter.
    assert settings.endpoint_host_dir is None


def _check_probes(container: dict[str, Any], settings: Settings) -> None:
    assert settings.metrics_address == METRICS_ADDRESS
    host, _, port = settings.metrics_address.rpartition(":")
    assert host == "0.0.0.0"  # the kubelet probes the pod's IP  # noqa: S104
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": int(port)}
    for probe, path in (("readinessProbe", READYZ), ("livenessProbe", HEALTHZ)):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports[get["port"]] == METRICS_PORT


def _check_root_only(container: dict[str, Any]) -> None:
    """uid 0 for the kubelet's root-owned directories, and nothing more."""
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _tolerates(pod: dict[str, Any], key: str) -> bool:
    return any(t.get("key") == key and t.get("operator") == "Exists" for t in pod.get("tolerations", []))


def _avoids_fake_pool(pod: dict[str, Any]) -> bool:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return bool(terms["nodeSelectorTerms"]) and all(
        {"key": FAKE_POOL_LABEL, "operator": "DoesNotExist"} in term["matchExpressions"]
        for term in terms["nodeSelectorTerms"]
    )


def _nvidia_settings(
    objects: list[dict[str, Any]], tmp_path: Path, env: pytest.MonkeyPatch
) -> tuple[NvidiaSettings, _Mounted]:
    pod = _pod(objects, NVIDIA)
    container = _container(pod)
    _apply_env(container, env)
    mounted = _Mounted(objects, pod, tmp_path)
    assert container["command"] == ["devplug-nvidia"]
    return load_nvidia_settings(mounted.args(container["args"])), mounted


def test_nvidia_daemonset_matches_the_program(
    layout: tuple[str, Layout, list[dict[str, Any]]], tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    _, expected, objects = layout
    pod = _pod(objects, NVIDIA)
    container = _container(pod)
    settings, mounted = _nvidia_settings(objects, tmp_path, clean_env)

    _check_kubelet_mounts(pod, settings, expected)
    _host_mount(pod, settings.cdi_dir, str(Settings().cdi_dir), kind="DirectoryOrCreate")
    # The host's driver root, read-only where the CDI spec generator looks for it.
    driver = _host_mount(pod, settings.driver_root_ctr_path, settings.driver_root, kind="Directory")
    assert driver["readOnly"] is True
    assert settings.config_file is not None
    config_mount, _ = _mount(pod, posixpath.dirname(mounted.container_path(settings.config_file)))
    assert config_mount["readOnly"] is True
    # Every hostPath volume is one of the above.
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        f"{expected.kubelet_root}/device-plugins",
        f"{expected.kubelet_root}/plugins_registry",
        str(settings.cdi_dir),
        settings.driver_root,
    }
    _check_probes(container, settings)
    _check_root_only(container)
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["runtimeClassName"] == "nvidia"
    assert _tolerates(pod, GPU_TAINT)
    assert _avoids_fake_pool(pod)
    assert pod["automountServiceAccountToken"] is False


def test_nvidia_example_config_time_slices_a_dgx(
    tmp_path: Path, short_dir: Path, clean_env: pytest.MonkeyPatch
) -> None:
    """The ConfigMap's config on a fake DGX A100: what the plugin would advertise."""
    settings, _ = _nvidia_settings(render(DEPLOY / "base"), tmp_path, clean_env)
    root = write_root(fake_nvml("dgx-a100").model, short_dir / "root")
    on_fake = settings.model_copy(update={"fake_nvml": "dgx-a100", "driver_root": str(root)})
    resources = apply_sharing(discover(on_fake), settings.sharing)
    assert set(resources) == {"nvidia.com/gpu.shared"}
    shared = resources["nvidia.com/gpu.shared"]
    assert len(shared.records) == 8
    assert set(shared.replicas.values()) == {4}
    assert shared.fail_requests_greater_than_one


def test_labels_daemonset_matches_the_program(
    layout: tuple[str, Layout, list[dict[str, Any]]], tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    _, _, objects = layout
    pod = _pod(objects, LABELS)
    container = _container(pod)
    assert container["command"] == ["devplug-nvidia", "labels"]
    mounted = _Mounted(objects, pod, tmp_path)
    settings = labels.parse_args(mounted.args(container["args"]), environ=_apply_env(container, clean_env))

    assert settings.output_file == labels.DEFAULT_OUTPUT_FILE
    features_d = posixpath.dirname(settings.output_file)
    _host_mount(pod, features_d, features_d, kind="DirectoryOrCreate")
    assert settings.sleep_interval == labels.DEFAULT_SLEEP_INTERVAL
    assert not settings.oneshot  # a DaemonSet keeps labelling (and removes the file when stopped)
    # The labels describe what the plugin advertises: the same config file, the same sharing.
    nvidia, _ = _nvidia_settings(objects, tmp_path / "nvidia", clean_env)
    assert settings.sharing == nvidia.sharing
    assert settings.mig_strategy == nvidia.mig_strategy
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {features_d}
    assert pod["runtimeClassName"] == "nvidia"
    assert _tolerates(pod, GPU_TAINT)
    assert _avoids_fake_pool(pod)
    assert container["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_fake_daemonset_matches_the_program(
    layout: tuple[str, Layout, list[dict[str, Any]]], tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    _, expected, objects = layout
    pod = _pod(objects, FAKE)
    container = _container(pod)
    assert container["command"] == ["devplug-fake"]
    _apply_env(container, clean_env)
    mounted = _Mounted(objects, pod, tmp_path)
    settings = load_settings(FakeSettings, mounted.args(container["args"]), prog="devplug-fake")

    _check_kubelet_mounts(pod, settings, expected)
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        f"{expected.kubelet_root}/device-plugins",
        f"{expected.kubelet_root}/plugins_registry",
    }
    _check_probes(container, settings)
    _check_root_only(container)
    assert settings.resources, "the scenario defines its resources"
    plugins = [FakePlugin(r) for r in settings.resource_configs()]
    assert [p.resource_name for p in plugins] == ["nvidia.com/gpu"]
    # A pool of its own: only labelled nodes, and workloads that tolerate its taint.
    assert pod["nodeSelector"] == {FAKE_POOL_LABEL: "true"}
    assert _tolerates(pod, FAKE_POOL_LABEL)
    assert pod["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in pod


@pytest.mark.parametrize("name", PLUGINS)
def test_overlays_change_only_what_they_say(name: str) -> None:
    base = _pod(render(DEPLOY / "base"), name)
    k3s = _pod(render(DEPLOY / "overlays/k3s"), name)
    watcher = _pod(render(DEPLOY / "overlays/plugin-watcher"), name)
    moved = {
        f"{DEFAULT_KUBELET_ROOT}/device-plugins": f"{K3S_KUBELET_ROOT}/device-plugins",
        f"{DEFAULT_KUBELET_ROOT}/plugins_registry": f"{K3S_KUBELET_ROOT}/plugins_registry",
    }
    for volume in base["volumes"]:
        if "hostPath" in volume:
            path = volume["hostPath"]["path"]
            volume["hostPath"]["path"] = moved.get(path, path)
    assert base == k3s
    base = _pod(render(DEPLOY / "base"), name)
    _container(base)["args"].append("--registration=watcher")
    assert base == watcher
