from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from devplug_nvidia import NvidiaSettings, load_nvidia_settings
from devplug_nvidia.config import ENV_NAMES

# field, flag argv, env value, file location (path in the file), values: flag / env / file / default
FIELDS: list[tuple[str, list[str], str, tuple[str, ...], Any, Any, Any, Any]] = [
    (
        "mig_strategy",
        ["--mig-strategy", "mixed"],
        "single",
        ("flags", "migStrategy"),
        "mixed",
        "single",
        "none",
        "none",
    ),
    (
        "fail_on_init_error",
        ["--fail-on-init-error=false"],
        "true",
        ("flags", "failOnInitError"),
        False,
        True,
        False,
        True,
    ),
    ("driver_root", ["--driver-root", "/a"], "/b", ("flags", "nvidiaDriverRoot"), "/a", "/b", "/c", "/"),
    ("dev_root", ["--dev-root", "/a"], "/b", ("flags", "nvidiaDevRoot"), "/a", "/b", "/c", None),
    (
        "pass_device_specs",
        ["--pass-device-specs"],
        "false",
        ("flags", "plugin", "passDeviceSpecs"),
        True,
        False,
        True,
        False,
    ),
    (
        "device_list_strategy",
        ["--device-list-strategy", "volume-mounts,cdi-cri"],
        "cdi-annotations",
        ("flags", "plugin", "deviceListStrategy"),
        ("volume-mounts", "cdi-cri"),
        ("cdi-annotations",),
        ("cdi-cri",),
        ("envvar",),
    ),
    (
        "device_id_strategy",
        ["--device-id-strategy", "index"],
        "uuid",
        ("flags", "plugin", "deviceIDStrategy"),
        "index",
        "uuid",
        "index",
        "uuid",
    ),
    (
        "gdrcopy_enabled",
        ["--gdrcopy-enabled"],
        "false",
        ("flags", "gdrcopyEnabled"),
        True,
        False,
        True,
        False,
    ),
    ("gds_enabled", ["--gds-enabled=true"], "false", ("flags", "gdsEnabled"), True, False, True, False),
    ("mofed_enabled", ["--mofed-enabled"], "false", ("flags", "mofedEnabled"), True, False, True, False),
    (
        "cdi_annotation_prefix",
        ["--cdi-annotation-prefix", "a.io/"],
        "b.io/",
        ("flags", "plugin", "cdiAnnotationPrefix"),
        "a.io/",
        "b.io/",
        "c.io/",
        "cdi.k8s.io/",
    ),
    (
        "nvidia_cdi_hook_path",
        ["--nvidia-cdi-hook-path", "/a"],
        "/b",
        ("flags", "plugin", "nvidiaCTKPath"),
        "/a",
        "/b",
        "/c",
        "/usr/bin/nvidia-ctk",
    ),
    (
        "driver_root_ctr_path",
        ["--driver-root-ctr-path", "/a"],
        "/b",
        ("flags", "plugin", "containerDriverRoot"),
        "/a",
        "/b",
        "/c",
        "/driver-root",
    ),
    ("mps_root", ["--mps-root", "/a"], "/b", ("flags", "mpsRoot"), "/a", "/b", "/c", None),
    (
        "device_discovery_strategy",
        ["--device-discovery-strategy", "nvml"],
        "tegra",
        ("flags", "deviceDiscoveryStrategy"),
        "nvml",
        "tegra",
        "nvml",
        "auto",
    ),
    ("imex_channel_ids", ["--imex-channel-ids", "0"], "", ("imex", "channelIDs"), (0,), (), (0,), ()),
    ("imex_required", ["--imex-required"], "false", ("imex", "required"), True, False, True, False),
    (
        "cdi_feature_flags",
        ["--cdi-feature-flags", "a,b"],
        "c",
        ("flags", "plugin", "cdiFeatureFlags"),
        ("a", "b"),
        ("c",),
        ("d",),
        (),
    ),
    (
        "shared_devices_allocation_policy",
        ["--shared-devices-allocation-policy", "packed"],
        "distributed",
        ("flags", "plugin", "sharedDevicesAllocationPolicy"),
        "packed",
        "distributed",
        "packed",
        "distributed",
    ),
    (
        "kubelet_socket",
        ["--kubelet-socket", "/a.sock"],
        "/b.sock",
        ("flags", "plugin", "kubeletSocket"),
        Path("/a.sock"),
        Path("/b.sock"),
        Path("/c.sock"),
        None,
    ),
]
FILE_VALUES: dict[str, Any] = {
    "driver_root": "/c",
    "dev_root": "/c",
    "cdi_annotation_prefix": "c.io/",
    "nvidia_cdi_hook_path": "/c",
    "driver_root_ctr_path": "/c",
    "mps_root": "/c",
    "imex_channel_ids": [0],
    "cdi_feature_flags": ["d"],
    "kubelet_socket": "/c.sock",
    "device_list_strategy": "cdi-cri",
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for names in ENV_NAMES.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("DEVPLUG_"):
            monkeypatch.delenv(name)


def _file(tmp_path: Path, doc: dict[str, Any], suffix: str = ".yaml") -> Path:
    path = tmp_path / f"config{suffix}"
    path.write_text(json.dumps(doc))
    return path


def _nest(where: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {where[-1]: value}
    for key in reversed(where[:-1]):
        doc = {key: doc}
    return doc


def _file_value(field: str, file_val: Any) -> Any:
    return FILE_VALUES.get(field, file_val)


@pytest.mark.parametrize(("field", "flag", "env", "where", "v_flag", "v_env", "v_file", "v_default"), FIELDS)
def test_precedence(  # noqa: PLR0917 - one parameter per table column
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    flag: list[str],
    env: str,
    where: tuple[str, ...],
    v_flag: Any,
    v_env: Any,
    v_file: Any,
    v_default: Any,
) -> None:
    cfg = _file(tmp_path, _nest(where, _file_value(field, v_file)))
    assert getattr(load_nvidia_settings([]), field) == v_default
    assert getattr(load_nvidia_settings(["--config-file", str(cfg)]), field) == v_file
    monkeypatch.setenv(ENV_NAMES[field][0], env)
    assert getattr(load_nvidia_settings(["--config-file", str(cfg)]), field) == v_env
    assert getattr(load_nvidia_settings([*flag, "--config-file", str(cfg)]), field) == v_flag


def test_every_upstream_field_is_covered() -> None:
    covered = {row[0] for row in FIELDS} | {"config_file", "fake_nvml"}
    assert set(ENV_NAMES) == covered


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _file(tmp_path, {"version": "v1", "flags": {"migStrategy": "single"}})
    monkeypatch.setenv("CONFIG_FILE", str(cfg))
    assert load_nvidia_settings([]).mig_strategy == "single"


@pytest.mark.parametrize(
    ("alias", "field"),
    [
        ("--nvidia-driver-root", "driver_root"),
        ("--nvidia-dev-root", "dev_root"),
        ("--nvidia-ctk-path", "nvidia_cdi_hook_path"),
        ("--container-driver-root", "driver_root_ctr_path"),
    ],
)
def test_flag_aliases(alias: str, field: str) -> None:
    assert getattr(load_nvidia_settings([alias, "/x"]), field) == "/x"
    assert getattr(load_nvidia_settings([f"{alias}=/y"]), field) == "/y"


@pytest.mark.parametrize(
    ("env", "field"),
    [("NVIDIA_CTK_PATH", "nvidia_cdi_hook_path"), ("CONTAINER_DRIVER_ROOT", "driver_root_ctr_path")],
)
def test_env_aliases(monkeypatch: pytest.MonkeyPatch, env: str, field: str) -> None:
    monkeypatch.setenv(env, "/z")
    assert getattr(load_nvidia_settings([]), field) == "/z"


def test_device_list_strategy_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    repeated = load_nvidia_settings(["--device-list-strategy", "envvar", "--device-list-strategy", "cdi-cri"])
    assert repeated.device_list_strategy == ("envvar", "cdi-cri")
    monkeypatch.setenv("DEVICE_LIST_STRATEGY", "envvar,cdi-annotations")
    assert load_nvidia_settings([]).device_list_strategy == ("envvar", "cdi-annotations")


def test_dev_root_defaults_to_driver_root() -> None:
    s = load_nvidia_settings(["--driver-root", "/run/nvidia/driver"])
    assert s.effective_dev_root == "/run/nvidia/driver"
    assert s.host_dev_path("/dev/nvidia0") == "/run/nvidia/driver/dev/nvidia0"
    assert load_nvidia_settings([]).host_dev_path("/dev/nvidia0") == "/dev/nvidia0"


def test_runner_options_still_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DEVPLUG_LOG_LEVEL", "debug")
    s = load_nvidia_settings(["--device-plugin-dir", str(tmp_path)])
    assert s.device_plugin_dir == tmp_path
    assert s.log_level == "debug"
    assert s.kubelet_socket_path == tmp_path / "kubelet.sock"


def test_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_nvidia_settings(["--fake-nvml", "dgx-a100"]).fake_nvml == "dgx-a100"
    monkeypatch.setenv("DEVPLUG_FAKE_NVML", "pcie-4")
    assert load_nvidia_settings([]).fake_nvml == "pcie-4"


def test_sharing_and_resources_parsed(tmp_path: Path) -> None:
    cfg = _file(
        tmp_path,
        {
            "version": "v1",
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [
                        {
                            "name": "nvidia.com/gpu",
                            "replicas": 4,
                            "devices": [0, "1", "0:1", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"],
                        },
                        {"name": "mig-1g.5gb", "rename": "small", "replicas": 2, "devices": 2},
                    ],
                }
            },
            "resources": {
                "gpus": [{"pattern": "*A100*", "name": "a100"}],
                "mig": [{"pattern": "1g.5gb", "name": "mig-small"}],
            },
        },
    )
    s = load_nvidia_settings(["--config-file", str(cfg)])
    assert s.sharing.strategy == "time-slicing"
    assert s.sharing.fail_requests_greater_than_one is False
    section = s.sharing.time_slicing
    assert section is not None and section.rename_by_default
    first, second = section.resources
    assert first.devices == ("0", "1", "0:1", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763")
    assert (
        second.name == "nvidia.com/mig-1g.5gb" and second.rename == "nvidia.com/small" and second.devices == 2
    )
    assert s.resources is not None
    assert s.resources.gpus[0].name == "nvidia.com/a100"
    assert s.resources.gpus[0].matches("NVIDIA A100-SXM4-40GB")
    assert not s.resources.gpus[0].matches("NVIDIA H100")


def test_mps_defaults(tmp_path: Path) -> None:
    cfg = _file(
        tmp_path,
        {
            "flags": {"mpsRoot": "/run/nvidia/mps"},
            "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}},
        },
    )
    s = load_nvidia_settings(["--config-file", str(cfg)])
    assert s.sharing.strategy == "mps"
    assert s.sharing.fail_requests_greater_than_one is True


def test_version_missing_is_v1(tmp_path: Path) -> None:
    cfg = _file(tmp_path, {"flags": {"migStrategy": "mixed"}}, ".json")
    assert load_nvidia_settings(["--config-file", str(cfg)]).mig_strategy == "mixed"


def test_empty_file(tmp_path: Path) -> None:
    cfg = tmp_path / "empty.yaml"
    cfg.write_text("")
    assert load_nvidia_settings(["--config-file", str(cfg)]) == load_nvidia_settings([]).model_copy(
        update={"config_file": cfg}
    )


def test_is_a_devplug_settings_subclass() -> None:
    from devplug import Settings

    assert issubclass(NvidiaSettings, Settings)
