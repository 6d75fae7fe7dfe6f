from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from devplug import ContainerAllocation, Device, DeviceSpec, Mount
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._config._file import Sharing
from devplug_nvidia._container._allocate import (
    ImexChannel,
    build_allocation,
    imex_channels,
    present_nodes,
    strip_replica,
)
from devplug_nvidia.plugin import NvidiaPlugin
from tests.nvidia.nvidia_records import G0, G1, GPUS, M0, MIG


def cfg(**kw: object) -> NvidiaSettings:
    return NvidiaSettings.model_validate(kw)


@pytest.mark.parametrize(("ids", "expected"), [("uuid", f"{G0},{G1}"), ("index", "0,1")])
def test_envvar(ids: str, expected: str) -> None:
    got = build_allocation(GPUS, cfg(device_id_strategy=ids))
    assert got == ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": expected})


def test_duplicates_removed_in_order() -> None:
    got = build_allocation([GPUS[1], GPUS[0], GPUS[1]], cfg())
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == f"{G1},{G0}"


def test_volume_mounts() -> None:
    got = build_allocation(GPUS, cfg(device_list_strategy=["volume-mounts"], device_id_strategy="index"))
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert got.mounts == (
        Mount(host_path="/dev/null", container_path="/var/run/nvidia-container-devices/0"),
        Mount(host_path="/dev/null", container_path="/var/run/nvidia-container-devices/1"),
    )


def test_cdi_annotations_only() -> None:
    got = build_allocation(
        GPUS, cfg(device_list_strategy=["cdi-annotations"], pass_device_specs=True), response_id="r1"
    )
    assert got == ContainerAllocation(
        annotations={
            "cdi.k8s.io/nvidia-device-plugin_r1": (
                f"k8s.device-plugin.nvidia.com/gpu={G0},k8s.device-plugin.nvidia.com/gpu={G1}"
            )
        }
    )


def test_cdi_annotation_key_is_random_uuid_and_prefix() -> None:
    got = build_allocation(GPUS, cfg(device_list_strategy=["cdi-annotations"], cdi_annotation_prefix="x.io/"))
    (key,) = got.annotations
    assert key.startswith("x.io/nvidia-device-plugin_") and len(key.rsplit("_", 1)[1]) == 36


def test_cdi_cri_index() -> None:
    got = build_allocation([MIG], cfg(device_list_strategy=["cdi-cri"], device_id_strategy="index"))
    assert got == ContainerAllocation(cdi_devices=("k8s.device-plugin.nvidia.com/gpu=1:0",))


def test_combination() -> None:
    got = build_allocation(
        GPUS[:1], cfg(device_list_strategy=["envvar", "cdi-cri", "cdi-annotations"]), response_id="r"
    )
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": G0}
    assert got.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={G0}",)
    assert got.annotations == {"cdi.k8s.io/nvidia-device-plugin_r": f"k8s.device-plugin.nvidia.com/gpu={G0}"}


def test_pass_device_specs_with_fake_dev_root(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):  # uvm-tools and modeset missing
        (tmp_path / "dev" / name).touch()
    present = present_nodes(tmp_path)
    assert present == {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    config = cfg(pass_device_specs=True, driver_root="/run/nvidia/driver")
    got = build_allocation([GPUS[0], MIG], config, present=present)
    root = "/run/nvidia/driver"
    assert got.devices == tuple(
        DeviceSpec(container_path=p, host_path=root + p, permissions="rw")
        for p in (
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia-caps/nvidia-cap66",
            "/dev/nvidia-caps/nvidia-cap67",
        )
    )
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": f"{G0},{M0}"}


def test_dev_root_overrides_driver_root() -> None:
    got = build_allocation(
        GPUS[:1], cfg(pass_device_specs=True, driver_root="/drv", dev_root="/"), present=()
    )
    assert got.devices == (DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/nvidia0"),)


@pytest.mark.parametrize(
    ("flag", "env"),
    [("gds_enabled", "NVIDIA_GDS"), ("mofed_enabled", "NVIDIA_MOFED"), ("gdrcopy_enabled", "NVIDIA_GDRCOPY")],
)
def test_feature_envs(flag: str, env: str) -> None:
    assert build_allocation(GPUS, cfg(**{flag: True})).envs[env] == "enabled"


def test_mps() -> None:
    sharing = Sharing.model_validate({"mps": {"resources": [{"name": "gpu", "replicas": 2}]}})
    config = cfg(sharing=sharing, mps_root="/run/nvidia/mps")
    got = build_allocation(GPUS[:1], config, resource_name="nvidia.com/gpu")
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": G0, "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe"}
    assert got.mounts == (
        Mount(container_path="/mps/nvidia.com/gpu/pipe", host_path="/run/nvidia/mps/nvidia.com/gpu/pipe"),
        Mount(container_path="/dev/shm", host_path="/run/nvidia/mps/shm"),
    )


def test_imex(tmp_path: Path) -> None:
    (tmp_path / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
    assert imex_channels([0], tmp_path, required=False) == ()
    with pytest.raises(FileNotFoundError, match="channel0"):
        imex_channels([0], tmp_path, required=True)
    (tmp_path / "dev/nvidia-caps-imex-channels/channel0").touch()
    imex = imex_channels([0], tmp_path, required=True)
    assert imex == (ImexChannel("0"),)
    config = cfg(
        device_list_strategy=["envvar", "volume-mounts", "cdi-cri"],
        pass_device_specs=True,
        device_id_strategy="index",
    )
    got = build_allocation(GPUS[:1], config, present=(), imex=imex)
    assert got.envs == {
        "NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices",
        "NVIDIA_IMEX_CHANNELS": "0",
    }
    assert (
        Mount(host_path="/dev/null", container_path="/var/run/nvidia-container-devices/imex/0") in got.mounts
    )
    assert got.devices[-1] == DeviceSpec.rw("/dev/nvidia-caps-imex-channels/channel0")
    assert got.cdi_devices == (
        "k8s.device-plugin.nvidia.com/gpu=0",
        "k8s.device-plugin.nvidia.com/imex-channel=0",
    )


@pytest.mark.parametrize(("raw", "real"), [("GPU-x::3", "GPU-x"), ("0:1::0", "0:1"), ("3", "3")])
def test_strip_replica(raw: str, real: str) -> None:
    assert strip_replica(raw) == real


def test_plugin_lists_and_allocates() -> None:
    plugin = NvidiaPlugin("nvidia.com/gpu", [*GPUS, MIG], cfg(device_id_strategy="index"))
    assert plugin.devices() == [
        Device(id="0", numa_nodes=(0,)),
        Device(id="1", numa_nodes=(1,)),
        Device(id="1:0"),
    ]

    async def go() -> tuple[list[list[Device]], ContainerAllocation]:
        listed = [list(await plugin.watch_devices().__anext__())]
        got = await plugin.allocate([Device(id="1::0"), Device(id="1::1"), Device(id="0")])
        return listed, got

    listed, got = anyio.run(go)
    assert listed == [plugin.devices()]
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": "1,0"}
    with pytest.raises(ValueError, match="unknown device"):
        anyio.run(plugin.allocate, [Device(id="9")])
