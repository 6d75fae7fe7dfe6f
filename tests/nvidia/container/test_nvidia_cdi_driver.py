from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from devplug.cdi import VERSIONS, CdiSpec
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._container._cdi import MOUNT_OPTIONS, build_cdi_spec, driver_view, write_cdi_spec
from devplug_nvidia._container._cdi_driver import (
    DriverFiles,
    driver_version_from_libraries,
    find_driver_files,
)
from devplug_nvidia.testing import DGX_A100, MIG_MIXED, write_root
from tests.nvidia.nvidia_records import GPUS, MIG

V = DGX_A100.driver_version  # 550.54.15
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_root(DGX_A100, tmp_path / "host")


def test_finds_the_driver_of_the_nvml_version(root: Path) -> None:
    assert driver_version_from_libraries(root) == V
    files = find_driver_files(root)
    assert files is not None and files.version == V
    assert f"{LIB}/libcuda.so.{V}" in files.libraries
    assert f"{LIB}/libnvidia-ml.so.{V}" in files.libraries
    assert f"{LIB}/libnvidia-ptxjitcompiler.so.{V}" in files.libraries
    assert f"{LIB}/vdpau/libvdpau_nvidia.so.{V}" in files.libraries
    assert f"{LIB}/libnvidia-nvvm70.so.4" in files.libraries
    # Unversioned links are the runtime's business (ldcache, create-symlinks), not mounts.
    assert f"{LIB}/libnvidia-ml.so.1" not in files.libraries
    assert f"{LIB}/libcuda.so.1" not in files.libraries
    assert files.binaries == (
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-debugdump",
        "/usr/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-control",
    )
    assert files.firmware == (
        f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin",
    )
    assert files.ipc == ("/var/run/nvidia-persistenced/socket",)


def test_other_version_or_no_driver(root: Path, tmp_path: Path) -> None:
    assert find_driver_files(root, "999.1") is None  # no library of that version
    assert find_driver_files(tmp_path / "empty") is None
    assert driver_version_from_libraries(tmp_path / "empty") is None


def test_merged_usr_directories_counted_once(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/libcuda.so.1.2").touch()
    os.symlink("usr/lib64", tmp_path / "lib64")
    files = find_driver_files(tmp_path, "1.2")
    assert files is not None and files.libraries == ("/usr/lib64/libcuda.so.1.2",)


def test_spec_mounts_from_host_driver_root(root: Path) -> None:
    # The plugin sees the driver at driver_root_ctr_path; host paths are under --driver-root.
    config = NvidiaSettings(driver_root="/run/nvidia/driver", driver_root_ctr_path=str(root))
    assert driver_view(config) == str(root)
    files = find_driver_files(driver_view(config))
    assert files is not None
    doc: Any = build_cdi_spec(GPUS, config, present=(), driver=files).to_dict()
    assert doc["cdiVersion"] in VERSIONS
    CdiSpec.model_validate(doc)
    mounts = doc["containerEdits"]["mounts"]
    assert len(mounts) == len(files.mounts)
    assert {
        "hostPath": f"/run/nvidia/driver{LIB}/libcuda.so.{V}",
        "containerPath": f"{LIB}/libcuda.so.{V}",
        "options": list(MOUNT_OPTIONS),
    } in mounts
    assert all(m["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"] for m in mounts)
    assert all(m["hostPath"] == "/run/nvidia/driver" + m["containerPath"] for m in mounts)
    symlinks, ldcache = doc["containerEdits"]["hooks"]
    assert symlinks == {
        "hookName": "createContainer",
        "path": "/usr/bin/nvidia-ctk",
        "args": [
            "nvidia-ctk",
            "hook",
            "create-symlinks",
            "--link",
            f"libcuda.so.1::{LIB}/libcuda.so",
            "--link",
            f"libnvidia-opticalflow.so.1::{LIB}/libnvidia-opticalflow.so",
        ],
    }
    assert ldcache["args"] == [
        "nvidia-ctk",
        "hook",
        "update-ldcache",
        "--folder",
        LIB,
        "--folder",
        f"{LIB}/vdpau",
    ]


def test_driver_root_slash_and_cdi_hook_binary(root: Path) -> None:
    config = NvidiaSettings(driver_root="/", nvidia_cdi_hook_path="/usr/local/bin/nvidia-cdi-hook")
    files = DriverFiles(version=V, libraries=(f"{LIB}/libcuda.so.{V}",))
    spec = build_cdi_spec([MIG], config, present=(), driver=files)
    (mount,) = spec.container_edits.mounts
    assert mount.host_path == mount.container_path == f"{LIB}/libcuda.so.{V}"
    names = [h.args[1] for h in spec.container_edits.hooks]
    assert names == ["create-symlinks", "update-ldcache", "chmod"]  # MIG: chmod last


def test_written_spec_finds_driver_under_driver_root(root: Path, tmp_path: Path) -> None:
    config = NvidiaSettings(
        driver_root=str(root), driver_root_ctr_path=str(tmp_path / "absent"), cdi_dir=tmp_path / "cdi"
    )
    (path,) = write_cdi_spec(GPUS, config)
    doc = json.loads(path.read_text())
    assert doc["cdiVersion"] in VERSIONS
    CdiSpec.model_validate(doc)
    paths = {m["containerPath"] for m in doc["containerEdits"]["mounts"]}
    assert f"{LIB}/libnvidia-ml.so.{V}" in paths and "/usr/bin/nvidia-smi" in paths
    assert all(m["hostPath"].startswith(str(root)) for m in doc["containerEdits"]["mounts"])


def test_written_spec_without_driver_logs(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    config = NvidiaSettings(
        driver_root=str(tmp_path), driver_root_ctr_path=str(tmp_path / "absent"), cdi_dir=tmp_path / "cdi"
    )
    with capture_logs() as logs:
        (path,) = write_cdi_spec(GPUS, config)
    assert "mounts" not in json.loads(path.read_text())["containerEdits"]
    assert [e["event"] for e in logs] == ["cdi_driver_files_not_found"]


def test_explicit_version_for_mig_model(tmp_path: Path) -> None:
    root = write_root(MIG_MIXED, tmp_path)
    files = find_driver_files(root, MIG_MIXED.driver_version)
    assert files is not None and all(
        p.endswith(MIG_MIXED.driver_version) or "nvvm70" in p for p in files.libraries
    )
