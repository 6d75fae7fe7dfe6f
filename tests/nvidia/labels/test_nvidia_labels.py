"""Feature labels per fake machine model, compared with expected files under data/labels/.

Set DEVPLUG_UPDATE_EXPECTED=1 to rewrite the expected files (then read the diff).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from devplug_nvidia._gpu._nvml import Nvml
from devplug_nvidia._labels import _node_labels as labels_core
from devplug_nvidia.discovery import discover_devices
from devplug_nvidia.labels import (
    LabelSettings,
    arch_family,
    format_labels,
    parse_args,
    read_node_labels,
    sanitise,
)
from devplug_nvidia.testing import MODELS, write_root

DATA = Path(__file__).parent / "data" / "labels"
MACHINE = "NVIDIA DGX A100 920-23687-2530-000"

_TIME_SLICING = """
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
_TIME_SLICING_RENAMED = """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
_MPS = """
version: v1
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
"""
_MIG_SHARED = """
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/mig-1g.5gb
        replicas: 3
        rename: tiny
"""

# expected file stem, model, extra flags, config file text
CASES: list[tuple[str, str, list[str], str | None]] = [
    ("dgx-a100", "dgx-a100", [], None),
    ("dgx-a100.time-slicing", "dgx-a100", [], _TIME_SLICING),
    ("dgx-a100.time-slicing-renamed", "dgx-a100", [], _TIME_SLICING_RENAMED),
    ("dgx-h100", "dgx-h100", [], None),
    ("pcie-a10.mps", "pcie-a10", [], _MPS),
    ("nvlink-v100", "nvlink-v100", [], None),
    ("legacy-k80", "legacy-k80", [], None),
    ("mig-mixed", "mig-mixed", [], None),
    ("mig-mixed.mixed", "mig-mixed", ["--mig-strategy", "mixed"], None),
    ("mig-mixed.single", "mig-mixed", ["--mig-strategy", "single"], None),
    ("mig-mixed.mps", "mig-mixed", [], _MPS),
    ("mig-uniform.single", "mig-uniform", ["--mig-strategy", "single"], None),
    ("mig-uniform.mixed-shared", "mig-uniform", ["--mig-strategy=mixed"], _MIG_SHARED),
]


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _labels(tmp_path: Path, model: str, flags: list[str], config: str | None) -> dict[str, str]:
    root = write_root(MODELS[model], tmp_path / "root")
    machine = tmp_path / "product_name"
    machine.write_text(MACHINE + "\n")
    argv = ["--fake-nvml", model, "--driver-root", str(root), "--machine-type-file", str(machine)]
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
        argv += ["--config-file", str(tmp_path / "config.yaml")]
    return read_node_labels(parse_args([*argv, "--no-timestamp", *flags], environ={}))


def test_every_model_has_a_case() -> None:
    assert {model for _, model, _, _ in CASES} == set(MODELS)


@pytest.mark.parametrize(("stem", "model", "flags", "config"), CASES, ids=[c[0] for c in CASES])
def test_labels_match_expected_file(
    tmp_path: Path, stem: str, model: str, flags: list[str], config: str | None
) -> None:
    text = format_labels(_labels(tmp_path, model, flags, config))
    expected = DATA / f"{stem}.txt"
    if os.environ.get("DEVPLUG_UPDATE_EXPECTED"):
        expected.parent.mkdir(parents=True, exist_ok=True)
        expected.write_text(text)
    assert text == expected.read_text()


def test_timestamp_label(tmp_path: Path) -> None:
    root = write_root(MODELS["pcie-a10"], tmp_path)
    settings = LabelSettings(fake_nvml="pcie-a10", driver_root=str(root), machine_type_file="")
    labels = read_node_labels(settings, now=1_700_000_000.7)
    assert labels["nvidia.com/gfd.timestamp"] == "1700000000"
    assert labels["nvidia.com/gpu.machine"] == "unknown"


def test_a_lost_gpu_is_not_counted(tmp_path: Path) -> None:
    from devplug_nvidia.testing import fake_nvml

    root = write_root(MODELS["dgx-h100"], tmp_path)
    fake = fake_nvml("dgx-h100")
    fake.devices[2].lost = True
    settings = LabelSettings(driver_root=str(root), no_timestamp=True, machine_type_file="")
    labels = read_node_labels(settings, module=fake)
    assert labels["nvidia.com/gpu.count"] == "7"
    # Lost between discovery and the MIG-mode check: left out too.
    fake = fake_nvml("dgx-h100")
    with Nvml.open(fake) as nvml:
        records = discover_devices(nvml, sysfs=root / "sys", proc=root / "proc")
        fake.devices[5].lost = True
        assert [g.record.index for g in labels_core._gpus(nvml, records, root / "sys")] == list("0123467")


def test_graphics_mode_and_missing_class(tmp_path: Path) -> None:
    from dataclasses import replace

    from devplug_nvidia.testing import FakeNvml

    model = MODELS["pcie-a10"]
    model = replace(model, gpus=tuple(replace(g, pci_class=0x030000) for g in model.gpus))
    root = write_root(model, tmp_path)
    settings = LabelSettings(driver_root=str(root), no_timestamp=True, machine_type_file="")
    sysfs = root / "sys"
    assert (
        read_node_labels(settings, module=FakeNvml(model), sysfs=sysfs)["nvidia.com/gpu.mode"] == "graphics"
    )
    for path in sysfs.glob("bus/pci/devices/*/class"):
        path.unlink()
    assert read_node_labels(settings, module=FakeNvml(model), sysfs=sysfs)["nvidia.com/gpu.mode"] == "unknown"


@pytest.mark.parametrize(
    ("cc", "family"),
    [
        ((3, 7), "kepler"),
        ((6, 0), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 7), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((11, 0), "undefined"),
        ((4, 0), "undefined"),
    ],
)
def test_arch_family(cc: tuple[int, int], family: str) -> None:
    assert arch_family(*cc) == family


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
        ("NVIDIA GeForce RTX 4090 (rev a1)", "NVIDIA-GeForce-RTX-4090-rev-a1"),
        ("  NVIDIA   H100 80GB HBM3 ", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA_L4.x/y", "NVIDIA_L4.xy"),
    ],
)
def test_sanitise(name: str, product: str) -> None:
    assert sanitise(name) == product
