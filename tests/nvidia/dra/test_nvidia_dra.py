"""devplug-nvidia as a DRA driver: the devices published for every fake machine, as NVIDIA's
gpu-kubelet-plugin v0.4.1 publishes them (nvidia-dra.md §1-3), accepted by the API server's rules."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from devplug.testing import FakeKubeAPI, serving_dra
from devplug.testing._kubeapi.validation import validate_slice
from devplug.topology import NUMA_NODE_ATTRIBUTE
from devplug_nvidia._dra._devices import (
    binary_quantity,
    cuda_version,
    mig_device_name,
    semantic_version,
)
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, GiProfile, GpuSpec, MachineModel, MigInstance, write_root
from devplug_nvidia.testing import _errors as C

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
PCI_BUS = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


# -- normalisation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("9.0", "9.0.0"),
        ("8.6", "8.6.0"),
        ("580.95.05", "580.95.5"),
        ("535.183.01", "535.183.1"),
        ("550.54.15", "550.54.15"),
        ("12", "12.0.0"),
        ("v1.2.3-rc.1+b.7", "1.2.3-rc.1+b.7"),
    ],
)
def test_versions_are_coerced_as_nvidia_coerces_them(text: str, version: str) -> None:
    assert semantic_version(text) == version


@pytest.mark.parametrize("text", ["", "x", "1.2.3.4", "1..2"])
def test_no_version_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a version"):
        semantic_version(text)


@pytest.mark.parametrize(
    ("number", "version"),
    [(13000, "13.0.0"), (12040, "12.4.0"), (12060, "12.6.0"), (11040, "11.4.0"), (12090, "12.9.0")],
)
def test_cuda_driver_version(number: int, version: str) -> None:
    assert cuda_version(number) == version


@pytest.mark.parametrize(
    ("value", "quantity"),
    [
        (0, "0"),
        (14, "14"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1500, "1500"),
        (80 * 2**30, "80Gi"),
        (9728 * 2**20, "9728Mi"),
        (81559 * 2**20, "81559Mi"),
        (2**60, "1Ei"),
        (2**70, "1024Ei"),
    ],
)
def test_binary_quantities_as_kubernetes_writes_them(value: int, quantity: str) -> None:
    assert binary_quantity(value) == quantity


@pytest.mark.parametrize(
    ("profile", "name"),
    [
        ("1g.10gb", "gpu-0-mig-1g10gb-19-0"),
        ("1g.10gb+me", "gpu-0-mig-1g10gb-me-19-0"),
        ("1g.5gb+me.all", "gpu-0-mig-1g5gb-meall-19-0"),
        ("1g.5gb-me", "gpu-0-mig-1g5gb-me-19-0"),
        ("1c.3g.20gb", "gpu-0-mig-1c3g20gb-19-0"),
        ("1g.24gb+gfx", "gpu-0-mig-1g24gb-gfx-19-0"),
    ],
)
def test_mig_device_names(profile: str, name: str) -> None:
    assert mig_device_name(0, profile, 19, 0) == name


# -- the published devices of every model ---------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    names: list[str]
    product: str
    brand: str
    architecture: str
    compute_capability: str
    driver_version: str
    cuda_version: str
    memory: str
    """The full GPUs' memory capacity."""


def _gpus(count: int) -> list[str]:
    return [f"gpu-{i}" for i in range(count)]


def _sevens(minor: int) -> list[str]:
    return [f"gpu-{minor}-mig-1g5gb-0-{start}" for start in range(7)]


_A100 = ("NVIDIA A100-SXM4-40GB", "Nvidia", "Ampere", "8.0.0", "550.54.15", "12.4.0", "40Gi")
EXPECTED = {
    "dgx-a100": Expected(_gpus(8), *_A100),
    "dgx-h100": Expected(
        _gpus(8), "NVIDIA H100 80GB HBM3", "Nvidia", "Hopper", "9.0.0", "560.35.3", "12.6.0", "81559Mi"
    ),
    "pcie-a10": Expected(
        _gpus(4), "NVIDIA A10", "Nvidia", "Ampere", "8.6.0", "550.54.15", "12.4.0", "23028Mi"
    ),
    "nvlink-v100": Expected(
        _gpus(4), "Tesla V100-SXM2-16GB", "Tesla", "Volta", "7.0.0", "535.183.1", "12.2.0", "16160Mi"
    ),
    "legacy-k80": Expected(
        _gpus(2), "Tesla K80", "Tesla", "Kepler", "3.7.0", "470.256.2", "11.4.0", "11441Mi"
    ),
    # GPU 3 has MIG on and no MIG devices: nothing; GPU 4 has MIG off: itself.
    "mig-mixed": Expected(
        [
            *_sevens(0),
            "gpu-1-mig-1g5gb-me-7-6",
            "gpu-1-mig-2g10gb-1-4",
            "gpu-1-mig-4g20gb-3-0",
            "gpu-2-mig-1c3g20gb-2-0",
            "gpu-2-mig-1g10gb-9-3",
            "gpu-2-mig-2c3g20gb-2-0",
            "gpu-2-mig-2g10gb-1-4",
            "gpu-4",
        ],
        *_A100,
    ),
    "mig-uniform": Expected([*_sevens(0), *_sevens(1)], *_A100),
}

# mig-mixed's MIG devices: capacities as the fake's A100-40GB profile table gives them.
_ENGINES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "memory")


def _mig_capacity(numbers: tuple[str, ...], slices: range) -> dict[str, str]:
    return dict(zip(_ENGINES, numbers, strict=True)) | {f"memorySlice{i}": "1" for i in slices}


MIG_MIXED_CAPACITY = {
    **{
        f"gpu-0-mig-1g5gb-0-{s}": _mig_capacity(("14", "1", "0", "0", "0", "0", "4864Mi"), range(s, s + 1))
        for s in range(7)
    },
    "gpu-1-mig-1g5gb-me-7-6": _mig_capacity(("14", "1", "1", "0", "1", "1", "4864Mi"), range(6, 7)),
    "gpu-1-mig-2g10gb-1-4": _mig_capacity(("28", "2", "1", "0", "0", "0", "9856Mi"), range(4, 6)),
    "gpu-1-mig-4g20gb-3-0": _mig_capacity(("56", "4", "2", "0", "0", "0", "19968Mi"), range(4)),
    # Two compute instances in one 3g GPU instance: the profile's engines and memory, each its
    # own multiprocessors (NVIDIA's driver does not start on such a GPU; see the module doc).
    "gpu-2-mig-1c3g20gb-2-0": _mig_capacity(("14", "3", "2", "0", "0", "0", "19968Mi"), range(3)),
    "gpu-2-mig-2c3g20gb-2-0": _mig_capacity(("28", "3", "2", "0", "0", "0", "19968Mi"), range(3)),
    "gpu-2-mig-2g10gb-1-4": _mig_capacity(("28", "2", "1", "0", "0", "0", "9856Mi"), range(4, 6)),
    "gpu-2-mig-1g10gb-9-3": _mig_capacity(("14", "1", "1", "0", "0", "0", "9856Mi"), range(3, 4)),
}


def _model_plugin(model: MachineModel, root: Path) -> NvidiaDraPlugin:
    settings = NvidiaSettings(driver_root=str(root), driver_name=DRIVER)
    return NvidiaDraPlugin.discover(settings, module=FakeNvml(model), sysfs=root / "sys", proc=root / "proc")


def _values(attributes: dict[str, Any]) -> dict[str, Any]:
    """API attribute values ({"string": "x"}) → plain values, versions as ("version", "1.2.3")."""
    out = {}
    for name, value in attributes.items():
        ((kind, item),) = value.items()
        out[name] = (kind, item) if kind == "version" else item
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("model", sorted(MODELS))
async def test_every_model_publishes_nvidias_devices(model: str, short_dir: Path) -> None:
    spec_model = MODELS[model]
    root = write_root(spec_model, short_dir / "root")
    plugin = _model_plugin(spec_model, root)
    expected = EXPECTED[model]
    gpus = {i: spec for i, spec in enumerate(spec_model.gpus)}
    async with FakeKubeAPI() as api, serving_dra(plugin, api, short_dir / "k", node_name=NODE):
        # Accepted by the API server's rules (the fake validates every write as resource.k8s.io/v1).
        (published,) = await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=15)
    assert validate_slice(published) == []
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        DRIVER,
        NODE,
        {"name": NODE, "generation": 1, "resourceSliceCount": 1},
    )
    devices = spec["devices"]
    assert [d["name"] for d in devices] == expected.names
    fake = FakeNvml(spec_model)
    fake.nvmlInit()
    for device in devices:
        attributes = _values(device["attributes"])
        minor = int(device["name"].split("-")[1])
        gpu = fake.devices[minor]
        common = {
            "productName": expected.product,
            "brand": expected.brand,
            "architecture": expected.architecture,
            "cudaComputeCapability": ("version", expected.compute_capability),
            "driverVersion": ("version", expected.driver_version),
            "cudaDriverVersion": ("version", expected.cuda_version),
            PCI_BUS: gpus[minor].bus_id.lower()[4:],
        }
        if gpus[minor].numa_node is not None:  # NVIDIA v0.5.0: the standard name, on GPUs and MIG devices
            common[NUMA_NODE_ATTRIBUTE] = gpus[minor].numa_node
        if "-mig-" in device["name"]:
            mig = next(m for m in gpu.mig_devices if m.uuid == attributes["uuid"])
            profile = device["name"].split("-mig-")[1].rsplit("-", 2)[0]
            assert attributes == {
                "type": "mig",
                "uuid": mig.uuid,
                "parentUUID": gpu.uuid,
                "profile": attributes["profile"],
                **common,
            }
            assert attributes["profile"].replace(".", "").replace("+", "-") == profile
            if model == "mig-mixed":
                assert {k: v["value"] for k, v in device["capacity"].items()} == MIG_MIXED_CAPACITY[
                    device["name"]
                ]
        else:
            assert attributes == {"type": "gpu", "uuid": gpu.uuid, **common}
            assert device["capacity"] == {"memory": {"value": expected.memory}}
        # No devplug attributes; the health monitor runs while the plugin is served, and the
        # only taint a fresh GPU may carry is unmonitored (legacy-k80: no health events).
        assert set(device) - {"taints"} == {"name", "attributes", "capacity"}
        assert all(t["key"] == f"{DRIVER}/unmonitored" for t in device.get("taints", ()))


def test_mig_profiles_carry_the_expected_names() -> None:
    names = {n for n in EXPECTED["mig-mixed"].names if "-mig-" in n}
    assert names == set(MIG_MIXED_CAPACITY)


# -- NVIDIA's own example (nvidia-dra.md §3): NVML's profile IDs, memory slices, PCIe roots --------

# An A100 80GB PCIe's GPU-instance profiles as NVML reports them: (index, ID, slices, placement
# size in memory slices, SMs, copy engines, decoders, encoders, JPEG, OFA, MiB).
_A100_80GB = (
    GiProfile(
        C.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 7, 14, 1, 0, 0, 0, 0, 9728, profile_id=19, placement_size=1
    ),
    GiProfile(0x7, 1, 1, 14, 1, 1, 0, 1, 1, 9728, profile_id=20, placement_size=1),
    GiProfile(0x9, 1, 4, 14, 1, 1, 0, 0, 0, 19968, profile_id=15, placement_size=2),
    GiProfile(0x1, 2, 3, 28, 2, 1, 0, 0, 0, 19968, profile_id=14, placement_size=2),
    GiProfile(0x2, 3, 2, 42, 3, 2, 0, 0, 0, 40192, profile_id=9, placement_size=4),
    GiProfile(0x3, 4, 1, 56, 4, 2, 0, 0, 0, 40192, profile_id=5, placement_size=4),
    GiProfile(0x4, 7, 1, 98, 7, 5, 0, 1, 1, 80384, profile_id=0, placement_size=8),
)
_A100_80GB_GPU = GpuSpec(
    name="NVIDIA A100 80GB PCIe",
    memory_mib=81920,
    compute_capability=(8, 0),
    bus_id="00000001:00:00.0",
    numa_node=0,
    mig_capable=True,
    gi_profiles=_A100_80GB,
)
EXAMPLE = MachineModel(
    name="nvidia-example",
    gpus=(
        _A100_80GB_GPU,
        replace(
            _A100_80GB_GPU,
            bus_id="00000002:00:00.0",
            mig_enabled=True,
            mig_instances=(MigInstance(C.NVML_GPU_INSTANCE_PROFILE_1_SLICE),) * 3 + (MigInstance(0x7),),
        ),
    ),
    levels=((0, 50), (50, 0)),
    driver_version="580.95.05",
    cuda_driver_version=13000,
)


def _link_pci_devices(root: Path, roots: dict[str, str]) -> None:
    """Make sysfs's bus/pci/devices entries links into the PCI hierarchy, as on a real host."""
    devices = root / "sys" / "bus" / "pci" / "devices"
    for bus_id, pci_root in roots.items():
        target = root / "sys" / "devices" / pci_root / bus_id
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(devices / bus_id, target)
        (devices / bus_id).symlink_to(os.path.relpath(target, devices))


def _example_plugin(root: Path) -> NvidiaDraPlugin:
    write_root(EXAMPLE, root)
    _link_pci_devices(root, {"0001:00:00.0": "pci0001:00", "0002:00:00.0": "pci0002:00"})
    return _model_plugin(EXAMPLE, root)


def _string(value: str) -> dict[str, str]:
    return {"string": value}


@pytest.mark.anyio
async def test_nvidias_example_slice(short_dir: Path) -> None:
    plugin = _example_plugin(short_dir / "root")
    async with FakeKubeAPI() as api, serving_dra(plugin, api, short_dir / "k", node_name=NODE):
        (published,) = await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=15)
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    assert list(devices) == [
        "gpu-0",
        "gpu-1-mig-1g10gb-19-0",
        "gpu-1-mig-1g10gb-19-1",
        "gpu-1-mig-1g10gb-19-2",
        "gpu-1-mig-1g10gb-me-20-3",
    ]
    fake = FakeNvml(EXAMPLE)
    gpu0, gpu1 = fake.devices
    common = {
        "productName": _string("NVIDIA A100 80GB PCIe"),
        "brand": _string("Nvidia"),
        "architecture": _string("Ampere"),
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        NUMA_NODE_ATTRIBUTE: {"int": 0},  # v0.5.0: the standard name, on GPUs and MIG devices
    }
    assert devices["gpu-0"] == {
        "name": "gpu-0",
        "attributes": {
            "architecture": _string("Ampere"),
            "brand": _string("Nvidia"),
            "cudaComputeCapability": {"version": "8.0.0"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "productName": _string("NVIDIA A100 80GB PCIe"),
            NUMA_NODE_ATTRIBUTE: {"int": 0},
            PCI_BUS: _string("0001:00:00.0"),
            PCIE_ROOT: _string("pci0001:00"),
            "type": _string("gpu"),
            "uuid": _string(gpu0.uuid),
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    mig = next(m for m in gpu1.mig_devices if m.gpu_instance.start == 2)
    assert devices["gpu-1-mig-1g10gb-19-2"] == {
        "name": "gpu-1-mig-1g10gb-19-2",
        "attributes": {
            **common,
            PCI_BUS: _string("0002:00:00.0"),
            PCIE_ROOT: _string("pci0002:00"),
            "type": _string("mig"),
            "uuid": _string(mig.uuid),
            "parentUUID": _string(gpu1.uuid),
            "profile": _string("1g.10gb"),
        },
        "capacity": {
            "multiprocessors": {"value": "14"},
            "copyEngines": {"value": "1"},
            "decoders": {"value": "0"},
            "encoders": {"value": "0"},
            "jpegEngines": {"value": "0"},
            "ofaEngines": {"value": "0"},
            "memory": {"value": "9728Mi"},
            "memorySlice2": {"value": "1"},
        },
    }
    me = devices["gpu-1-mig-1g10gb-me-20-3"]
    assert me["attributes"]["profile"] == _string("1g.10gb+me")
    assert {k: v["value"] for k, v in me["capacity"].items() if k.startswith("memorySlice")} == {
        "memorySlice3": "1"
    }


def test_addressing_mode_is_published_when_nvml_has_it(tmp_path: Path) -> None:
    model = replace(
        EXAMPLE,
        gpus=(replace(_A100_80GB_GPU, addressing_mode=C.NVML_DEVICE_ADDRESSING_MODE_HMM), EXAMPLE.gpus[1]),
    )
    write_root(model, tmp_path)
    plugin = _model_plugin(model, tmp_path)
    by_name = {d.name: d for d in plugin.devices}
    assert by_name["gpu-0"].attributes["addressingMode"] == "HMM"
    assert "addressingMode" not in by_name["gpu-1-mig-1g10gb-19-0"].attributes
    assert PCIE_ROOT not in by_name["gpu-0"].attributes  # sysfs entries are not links: unresolvable


def test_an_unknown_architecture_or_brand_is_published_as_unknown(tmp_path: Path) -> None:
    model = replace(EXAMPLE, gpus=(replace(_A100_80GB_GPU, architecture=13, brand=18),))
    write_root(model, tmp_path)
    (device,) = _model_plugin(model, tmp_path).devices
    assert (device.attributes["architecture"], device.attributes["brand"]) == ("Unknown", "Unknown")


def test_the_device_plugin_discovery_makes_no_extra_nvml_call(tmp_path: Path) -> None:
    from devplug_nvidia._gpu._nvml import Nvml
    from devplug_nvidia.discovery import discover_devices

    model = MODELS["mig-mixed"]
    root = write_root(model, tmp_path)
    fake = FakeNvml(model)
    with Nvml.open(fake, driver_root=str(root)) as nvml:
        plain = discover_devices(nvml, sysfs=root / "sys", proc=root / "proc")
    assert not {"nvmlDeviceGetBrand", "nvmlDeviceGetArchitecture", "nvmlSystemGetDriverVersion"} & set(
        fake.calls
    )
    assert all(r.details is None for r in plain)
    with Nvml.open(FakeNvml(model), driver_root=str(root)) as nvml:
        detailed = discover_devices(nvml, sysfs=root / "sys", proc=root / "proc", details=True)
    # The same records apart from the details.
    assert [
        replace(r, details=None, mig=r.mig and replace(r.mig, gpu_instance=None)) for r in detailed
    ] == plain


def test_device_plugin_mig_names_go_by_the_profile_index_not_nvmls_id(tmp_path: Path) -> None:
    """NVML reports a GPU instance's profile by ID (19 = 1g.10gb, 20 = 1g.10gb+me on an A100
    80GB); the device-plugin path names MIG resources from the index those IDs map to."""
    from devplug_nvidia._gpu._nvml import Nvml
    from devplug_nvidia.discovery import discover_devices

    root = write_root(EXAMPLE, tmp_path)
    with Nvml.open(FakeNvml(EXAMPLE), driver_root=str(root)) as nvml:
        records = discover_devices(nvml, sysfs=root / "sys", proc=root / "proc")
    profiles = sorted(r.mig.profile for r in records if r.mig is not None)
    assert profiles == ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb+me"]
