"""Discovery on every fake machine model, each MIG strategy, profile names, and real NVML."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devplug.errors import ConfigError
from devplug_nvidia._gpu._model import GpuRecord
from devplug_nvidia._gpu._nvml import Nvml
from devplug_nvidia.discovery import (
    MigStrategyError,
    apply_mig_strategy,
    discover,
    discover_devices,
    mig_profile_name,
    read_mig_minors,
)
from devplug_nvidia.testing import MODELS, fake_nvml, mig_cap_minor, write_root

_A100_BYTES = 40960 * 1024 * 1024


def _records(model: str, root: Path) -> list[GpuRecord]:
    fake = fake_nvml(model)
    write_root(fake.model, root)
    with Nvml.open(fake) as nvml:
        return discover_devices(nvml, sysfs=root / "sys", proc=root / "proc")


def _ids(resources: dict[str, list[GpuRecord]]) -> dict[str, list[str]]:
    return {name: [r.index for r in records] for name, records in resources.items()}


@pytest.mark.parametrize(
    ("memory_mb", "gpu", "ci", "profile_id", "expected"),
    [
        (4864, 1, 1, 0x0, "1g.5gb"),
        (9856, 2, 2, 0x1, "2g.10gb"),
        (19968, 3, 3, 0x2, "3g.20gb"),
        (19968, 4, 4, 0x3, "4g.20gb"),
        (40192, 7, 7, 0x4, "7g.40gb"),
        (9856, 1, 1, 0x9, "1g.10gb"),
        (4864, 1, 1, 0x7, "1g.5gb+me"),
        (4864, 1, 1, 0xF, "1g.5gb+me.all"),
        (4864, 1, 1, 0xD, "1g.5gb-me"),
        (4864, 1, 1, 0xA, "1g.5gb+gfx"),
        (19968, 3, 1, 0x2, "1c.3g.20gb"),
        (19968, 3, 2, None, "2c.3g.20gb"),
    ],
)
def test_profile_names_on_a100_40gb(
    memory_mb: int, gpu: int, ci: int, profile_id: int | None, expected: str
) -> None:
    name = mig_profile_name(
        gpu_slices=gpu,
        compute_slices=ci,
        memory_mb=memory_mb,
        parent_memory_bytes=_A100_BYTES,
        gi_profile_id=profile_id,
    )
    assert name == expected


@pytest.mark.parametrize(
    ("memory_mb", "parent_mib", "expected"),
    [
        (9984, 81559, "1g.10gb"),
        (40448, 81559, "4g.40gb"),
        (10240, 81920, "1g.10gb"),
        (20096, 81920, "1g.20gb"),
    ],
)
def test_profile_memory_rounding_on_80gb(memory_mb: int, parent_mib: int, expected: str) -> None:
    slices = int(expected[0])
    name = mig_profile_name(
        gpu_slices=slices, compute_slices=slices, memory_mb=memory_mb, parent_memory_bytes=parent_mib << 20
    )
    assert name == expected


def test_dgx_a100_full_gpus(tmp_path: Path) -> None:
    records = _records("dgx-a100", tmp_path)
    assert [r.index for r in records] == [str(i) for i in range(8)]
    assert [r.numa_node for r in records] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert records[0].bus_id == "0000:07:00.0"
    assert records[0].name == "NVIDIA A100-SXM4-40GB"
    assert (records[0].memory_mib, records[0].compute_capability, records[0].minor) == (40960, (8, 0), 0)
    assert records[7].device_paths == ("/dev/nvidia7",)
    assert not any(r.mig_enabled for r in records)
    for strategy in ("none", "single", "mixed"):
        assert _ids(apply_mig_strategy(records, strategy)) == {"nvidia.com/gpu": [str(i) for i in range(8)]}
    assert records[3].device_id("uuid") == records[3].uuid
    assert records[3].device_id("index") == "3"


@pytest.mark.parametrize(
    ("model", "numa", "name"),
    [
        ("dgx-h100", [0, 0, 0, 0, 1, 1, 1, 1], "NVIDIA H100 80GB HBM3"),
        ("pcie-a10", [0, 0, 1, 1], "NVIDIA A10"),
        ("nvlink-v100", [None] * 4, "Tesla V100-SXM2-16GB"),
        ("legacy-k80", [0, 0], "Tesla K80"),
    ],
)
def test_full_gpu_models(tmp_path: Path, model: str, numa: list[int | None], name: str) -> None:
    records = _records(model, tmp_path)
    assert [r.numa_node for r in records] == numa
    assert {r.name for r in records} == {name}
    assert all(r.kind == "gpu" for r in records)
    for strategy in ("none", "single", "mixed"):
        resources = apply_mig_strategy(records, strategy)
        assert _ids(resources) == {"nvidia.com/gpu": [str(i) for i in range(len(numa))]}


def test_no_sysfs_means_no_numa(tmp_path: Path) -> None:
    with Nvml.open(fake_nvml("dgx-a100")) as nvml:
        records = discover_devices(nvml, sysfs=tmp_path / "nothing", proc=tmp_path / "nothing")
    assert {r.numa_node for r in records} == {None}


def test_mig_mixed_records(tmp_path: Path) -> None:
    records = _records("mig-mixed", tmp_path)
    gpus = [r for r in records if r.kind == "gpu"]
    assert [g.mig_enabled for g in gpus] == [True, True, True, True, False]
    migs = {r.index: r for r in records if r.kind == "mig"}
    assert len(migs) == 7 + 3 + 4
    me = migs["1:2"]
    assert me.mig is not None
    assert me.mig.profile == "1g.5gb+me"
    assert me.uuid.startswith("MIG-")
    assert (me.minor, me.numa_node, me.bus_id, me.memory_mib) == (1, 3, "0000:0f:00.0", 4864)
    assert me.mig.parent_uuid == gpus[1].uuid
    gi, ci = me.mig.gpu_instance_id, me.mig.compute_instance_id
    caps = (
        f"/dev/nvidia-caps/nvidia-cap{mig_cap_minor(1, gi)}",
        f"/dev/nvidia-caps/nvidia-cap{mig_cap_minor(1, gi, ci)}",
    )
    assert me.mig.cap_paths == caps
    assert me.device_paths == ("/dev/nvidia1", *caps)
    assert me.device_id("index") == "1:2"
    assert [migs[i].mig.profile for i in ("2:0", "2:1", "2:2", "2:3")] == [  # type: ignore[union-attr]
        "1c.3g.20gb",
        "2c.3g.20gb",
        "2g.10gb",
        "1g.10gb",
    ]


def test_mig_mixed_strategies(tmp_path: Path) -> None:
    records = _records("mig-mixed", tmp_path)
    assert _ids(apply_mig_strategy(records, "none")) == {"nvidia.com/gpu": ["0", "1", "2", "3", "4"]}
    with capture_logs() as logs:
        mixed = apply_mig_strategy(records, "mixed")
    assert _ids(mixed) == {
        "nvidia.com/gpu": ["4"],
        "nvidia.com/mig-1g.5gb": [f"0:{i}" for i in range(7)],
        "nvidia.com/mig-4g.20gb": ["1:0"],
        "nvidia.com/mig-2g.10gb": ["1:1", "2:2"],
        "nvidia.com/mig-1g.5gb.me": ["1:2"],
        "nvidia.com/mig-1c.3g.20gb": ["2:0"],
        "nvidia.com/mig-2c.3g.20gb": ["2:1"],
        "nvidia.com/mig-1g.10gb": ["2:3"],
    }
    assert [(e["event"], e["gpu"]) for e in logs if e["log_level"] == "warning"] == [
        ("mig_enabled_without_devices", "3")
    ]
    with pytest.raises(MigStrategyError, match=r"GPU 3 .* no MIG devices"):
        apply_mig_strategy(records, "single")


def test_single_strategy_errors(tmp_path: Path) -> None:
    records = _records("mig-mixed", tmp_path)
    without_empty = [r for r in records if r.index != "3"]
    with pytest.raises(MigStrategyError, match="combination of MIG and non-MIG GPUs"):
        apply_mig_strategy(without_empty, "single")
    only_mig = [r for r in without_empty if r.index != "4"]
    with pytest.raises(MigStrategyError, match="more than one MIG profile") as info:
        apply_mig_strategy(only_mig, "single")
    assert isinstance(info.value, ConfigError)


def test_single_strategy_on_uniform_mig(tmp_path: Path) -> None:
    records = _records("mig-uniform", tmp_path)
    resources = apply_mig_strategy(records, "single")
    assert _ids(resources) == {"nvidia.com/gpu": [f"{g}:{s}" for g in range(2) for s in range(7)]}
    assert _ids(apply_mig_strategy(records, "mixed")) == {
        "nvidia.com/mig-1g.5gb": [f"{g}:{s}" for g in range(2) for s in range(7)]
    }


def test_gpu_lost_during_discovery_is_skipped(tmp_path: Path) -> None:
    fake = fake_nvml("dgx-h100")
    fake.nvmlInit()
    fake.lose_gpu(2)
    with Nvml.open(fake) as nvml, capture_logs() as logs:
        records = discover_devices(nvml, sysfs=tmp_path, proc=tmp_path)
    assert [r.index for r in records] == ["0", "1", "3", "4", "5", "6", "7"]
    assert any(e["event"] == "gpu_lost_skipped" for e in logs)


def test_missing_mig_minors(tmp_path: Path) -> None:
    assert read_mig_minors(tmp_path) is None
    with Nvml.open(fake_nvml("mig-uniform")) as nvml, capture_logs() as logs:
        records = discover_devices(nvml, sysfs=tmp_path, proc=tmp_path)
    assert all(r.mig.cap_paths == () for r in records if r.mig is not None)
    assert any(e["event"] == "mig_caps_not_found" for e in logs)


@dataclass(frozen=True)
class _Settings:
    mig_strategy: str = "mixed"
    driver_root: str = "/"
    fake_nvml: str | None = None


def test_discover_from_settings_with_a_fake_model(tmp_path: Path) -> None:
    write_root(MODELS["mig-uniform"], tmp_path)
    settings = _Settings(driver_root=str(tmp_path), fake_nvml="mig-uniform")
    resources = discover(settings)  # type: ignore[arg-type]
    (records,) = resources.values()
    assert list(resources) == ["nvidia.com/mig-1g.5gb"]
    assert records[0].numa_node == 3
    assert records[0].mig is not None
    assert records[0].mig.cap_paths


def test_discover_with_an_unknown_fake_model() -> None:
    with pytest.raises(Exception, match="unknown fake NVML model"):
        discover(_Settings(fake_nvml="nope"))  # type: ignore[arg-type]


@pytest.mark.gpu
def test_real_nvml_discovery_every_strategy() -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU: nvidia-smi not found")
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    if smi.returncode != 0:
        pytest.skip(f"no NVIDIA GPU: nvidia-smi -L failed: {smi.stderr.strip()}")
    with Nvml.open() as nvml:
        records = discover_devices(nvml)
    gpus = [r for r in records if r.kind == "gpu"]
    assert len(gpus) == smi.stdout.count("\nGPU ") + smi.stdout.startswith("GPU ")
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.uuid in smi.stdout
        assert gpu.memory_mib > 0
        assert Path(f"/sys/bus/pci/devices/{gpu.bus_id}").exists() or gpu.numa_node is None
    assert list(apply_mig_strategy(records, "none")) == ["nvidia.com/gpu"]
    for strategy in ("single", "mixed"):
        try:
            resources = apply_mig_strategy(records, strategy)
        except MigStrategyError:
            continue
        assert sum(len(v) for v in resources.values()) >= 1


def test_library_is_loaded_from_the_container_mount_of_the_driver_root(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from devplug_nvidia.discovery import library_root

    mounted = tmp_path / "driver-root"
    mounted.mkdir()
    host = SimpleNamespace(driver_root="/run/nvidia/driver", driver_root_ctr_path=str(mounted))
    assert library_root(host) == str(mounted)  # type: ignore[arg-type]
    missing = SimpleNamespace(driver_root="/run/nvidia/driver", driver_root_ctr_path=str(tmp_path / "none"))
    assert library_root(missing) == "/run/nvidia/driver"  # type: ignore[arg-type]
    on_host = SimpleNamespace(driver_root="/", driver_root_ctr_path=str(mounted))
    assert library_root(on_host) == "/"  # type: ignore[arg-type]


def test_resources_section_names_gpus_and_mig_profiles(tmp_path: Path) -> None:
    from devplug_nvidia.config import load_nvidia_settings
    from devplug_nvidia.discovery import discover
    from devplug_nvidia.testing import fake_nvml, write_root

    root = write_root(fake_nvml("mig-mixed").model, tmp_path / "root")
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\n"
        "resources:\n"
        "  gpus: [{pattern: '*A100*', name: a100}]\n"
        "  mig: [{pattern: '1g.5gb', name: mig-small}, {pattern: '*', name: mig-other}]\n"
    )
    settings = load_nvidia_settings(
        [
            "--config-file",
            str(config),
            "--mig-strategy",
            "mixed",
            "--fake-nvml",
            "mig-mixed",
            "--driver-root",
            str(root),
        ]
    )
    resources = discover(settings)
    # Upstream parses these patterns and ignores them; here they name the resources.
    assert "nvidia.com/gpu" not in resources
    assert {r.kind for r in resources["nvidia.com/a100"]} == {"gpu"}
    assert {r.mig.profile for r in resources["nvidia.com/mig-small"] if r.mig} == {"1g.5gb"}
    other = {r.mig.profile for r in resources["nvidia.com/mig-other"] if r.mig}
    assert "1g.5gb" not in other and "2g.10gb" in other
