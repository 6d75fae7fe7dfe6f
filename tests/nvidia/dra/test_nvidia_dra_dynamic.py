"""Dynamic MIG (DynamicMIG gate): every profile at every placement of a MIG-enabled GPU is a device
consuming its GPU's shared counters; prepare creates the GPU and compute instance through NVML,
unprepare destroys them, and a prepare that fails half-way leaves nothing behind."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug._dra.inventory import Inventory
from devplug._dra.slices import CounterSlice, chunks, counter_set_entry, declared_counter_sets, device_entry
from devplug.models import AllocatedDevice, Claim, Device
from devplug_nvidia._dra._dynamic import DynamicMigError, counter_set_name
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root

pytestmark = pytest.mark.anyio

GATES = "DynamicMIG=true"
EMPTY = 3  # mig-mixed: GPU 3 has MIG on and no instances, GPU 4 has MIG off


@dataclass
class Node:
    plugin: NvidiaDraPlugin
    fake: FakeNvml
    root: Path
    settings: NvidiaSettings

    def device(self, name: str) -> Device:
        return next(d for d in self.plugin.devices if d.name == name)

    def allocated(self, *names: str) -> list[AllocatedDevice]:
        return [AllocatedDevice(request="mig", name=n, pool="node-a", device=self.device(n)) for n in names]

    def instances(self, gpu: int = EMPTY) -> list[tuple[int, int, list[int]]]:
        """(GI ID, placement start, CI IDs) of each GPU instance on ``gpu``."""
        return [
            (gi.id, gi.start, [ci.id for ci in gi.compute_instances])
            for gi in self.fake.devices[gpu].instances
        ]

    @property
    def state_dir(self) -> Path:
        return self.settings.dra_plugins_dir / "gpu.nvidia.com" / "dynamic-mig"


def node(model: str, tmp_path: Path, gates: str = GATES) -> Node:
    root = write_root(MODELS[model], tmp_path / "root")
    settings = NvidiaSettings(
        driver_root=str(root),
        driver_name="gpu.nvidia.com",
        feature_gates=gates,
        kubelet_root=tmp_path / "kubelet",
        cdi_dir=tmp_path / "cdi",
    )
    fake = FakeNvml(MODELS[model])
    fake.proc_root = root / "proc"  # where the "driver" writes capability files of new instances
    plugin = NvidiaDraPlugin.discover(settings, module=fake, sysfs=root / "sys", proc=root / "proc")
    return Node(plugin, fake, root, settings)


def test_every_profile_at_every_placement_is_a_device(tmp_path: Path) -> None:
    n = node("mig-mixed", tmp_path)
    names = [d.name for d in n.plugin.devices]
    # GPUs 0-3 have MIG on: 7 1g + 7 1g+me + 7 1g.10gb + 3 2g + 2 3g + 1 4g + 1 7g each; GPU 4 is whole.
    assert len(names) == 4 * 28 + 1
    assert "gpu-4" in names
    assert not [d for d in n.plugin.devices if str(d.attributes.get("uuid", "")).startswith("MIG-")]
    mine = [d for d in n.plugin.devices if d.attributes.get("parentUUID") == n.fake.devices[EMPTY].uuid]
    assert sorted({str(d.attributes["profile"]) for d in mine}) == [
        "1g.10gb",
        "1g.5gb",
        "1g.5gb+me",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ]
    three = n.device("gpu-3-mig-3g20gb-2-4")
    assert three.attributes["type"] == "mig"
    assert "uuid" not in three.attributes
    assert three.capacity == {
        "multiprocessors": "42",
        "copyEngines": "3",
        "decoders": "2",
        "encoders": "0",
        "jpegEngines": "0",
        "ofaEngines": "0",
        "memory": "19968Mi",
    }
    (consumption,) = three.consumes_counters
    assert consumption.counter_set == counter_set_name(3) == "gpu-3-counter-set"
    assert consumption.counters == {
        "multiprocessors": "42",
        "copy-engines": "3",
        "decoders": "2",
        "encoders": "0",
        "jpeg-engines": "0",
        "ofa-engines": "0",
        "memory": "19968Mi",
        "memory-slice-4": "1",
        "memory-slice-5": "1",
        "memory-slice-6": "1",
    }
    (counter_set,) = three.shared_counters
    assert counter_set.counters == {
        "multiprocessors": "98",
        "copy-engines": "7",
        "decoders": "5",
        "encoders": "0",
        "jpeg-engines": "1",
        "ofa-engines": "1",
        "memory": "40192Mi",
        **{f"memory-slice-{i}": "1" for i in range(7)},
    }
    assert all(d.shared_counters == (counter_set,) for d in mine)


def test_gpus_without_mig_stay_whole_and_without_counters(tmp_path: Path) -> None:
    n = node("pcie-a10", tmp_path)
    assert [d.name for d in n.plugin.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert not any(d.consumes_counters or d.shared_counters for d in n.plugin.devices)


def test_without_the_gate_mig_stays_static(tmp_path: Path) -> None:
    n = node("mig-mixed", tmp_path, gates="")
    assert n.plugin.dynamic_mig is None
    assert all(d.attributes.get("uuid") for d in n.plugin.devices)
    assert not any(d.consumes_counters for d in n.plugin.devices)


def _spec(prepared: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(prepared[0].cdi_spec_file.text)
    return doc


async def test_prepare_creates_the_instance_and_unprepare_destroys_it(tmp_path: Path) -> None:
    n = node("mig-mixed", tmp_path)
    claim = Claim(uid="uid-1", namespace="ns", name="c1")
    prepared = await n.plugin.prepare_claim(claim, n.allocated("gpu-3-mig-2g10gb-1-2"), [])
    ((gi_id, start, cis),) = n.instances()
    assert (start, cis) == (2, [0])
    (mig,) = [m for m in n.fake.devices[EMPTY].mig_devices]
    spec = _spec(prepared)
    (device,) = spec["devices"]
    assert device["name"] == "uid-1-gpu-3-mig-2g10gb-1-2"
    paths = [node["path"] for node in device["containerEdits"]["deviceNodes"]]
    assert "/dev/nvidia3" in paths
    assert sum(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths) == 2  # the GI's and the CI's
    assert (n.state_dir / "uid-1.json").exists()
    assert mig.uuid.startswith("MIG-")

    await n.plugin.unprepare_claim(claim)
    assert n.instances() == []
    assert not n.fake.devices[EMPTY].mig_devices
    assert not (n.state_dir / "uid-1.json").exists()
    assert gi_id > 0
    await n.plugin.unprepare_claim(claim)  # again: nothing left to do


async def test_an_overlapping_placement_fails_and_rolls_back_what_the_claim_made(tmp_path: Path) -> None:
    n = node("mig-mixed", tmp_path)
    first = Claim(uid="uid-a", namespace="ns", name="a")
    await n.plugin.prepare_claim(first, n.allocated("gpu-3-mig-3g20gb-2-0"), [])
    second = Claim(uid="uid-b", namespace="ns", name="b")
    with pytest.raises(
        DynamicMigError, match="gpu-3-mig-1g5gb-0-1: creating the GPU instance failed: "
    ) as error:
        await n.plugin.prepare_claim(second, n.allocated("gpu-3-mig-1g5gb-0-5", "gpu-3-mig-1g5gb-0-1"), [])
    assert "Insufficient Resources" in str(error.value)
    assert [start for _gi, start, _ci in n.instances()] == [0]  # the 1g at 5 was destroyed again
    assert not (n.state_dir / "uid-b.json").exists()
    await n.plugin.unprepare_claim(first)
    assert n.instances() == []


async def test_a_prepare_failing_after_the_creation_destroys_the_instances(tmp_path: Path) -> None:
    n = node("mig-mixed", tmp_path)
    n.fake.proc_root = None  # no capability files: the claim's CDI spec cannot be written
    claim = Claim(uid="uid-x", namespace="ns", name="x")
    with pytest.raises(Exception, match="capabilit"):
        await n.plugin.prepare_claim(claim, n.allocated("gpu-3-mig-1g5gb-0-3"), [])
    assert n.instances() == []
    assert not (n.state_dir / "uid-x.json").exists()


async def test_a_failed_compute_instance_destroys_its_gpu_instance(tmp_path: Path) -> None:
    n = node("mig-mixed", tmp_path)
    n.fake.fail("nvmlGpuInstanceCreateComputeInstance", n.fake.NVML_ERROR_UNKNOWN)
    claim = Claim(uid="uid-y", namespace="ns", name="y")
    with pytest.raises(DynamicMigError, match="creating the compute instance failed"):
        await n.plugin.prepare_claim(claim, n.allocated("gpu-3-mig-4g20gb-3-0"), [])
    assert n.instances() == []


def test_the_slices_carry_the_counter_sets_first_then_64_devices_each(tmp_path: Path) -> None:

    n = node("mig-mixed", tmp_path)
    inventory = Inventory([n.plugin])
    inventory.update(0, n.plugin.devices)
    entries = inventory.current.entries
    sets, conflicts = declared_counter_sets(e.device for e in entries)
    assert conflicts == []
    assert [s.name for s in sets] == [f"gpu-{i}-counter-set" for i in range(4)]
    parts = chunks(
        [device_entry(e, "gpu.nvidia.com", taint_unhealthy=True) for e in entries],
        [counter_set_entry(s) for s in sets],
    )
    assert [(isinstance(p, CounterSlice), len(p)) for p in parts] == [(True, 4), (False, 64), (False, 49)]
    whole = next(d for p in parts[1:] for d in p if d["name"] == "gpu-4")
    assert "consumesCounters" not in whole
