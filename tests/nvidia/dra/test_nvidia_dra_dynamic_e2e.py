"""Dynamic MIG the whole way, as a cluster runs it: ``devplug-nvidia --api dra --feature-gates
DynamicMIG=true`` publishing to a FakeKubeAPI, registered with a FakeKubelet through its
plugin-watcher directory, claims allocated in the API server and prepared and unprepared by the
kubelet over the DRA socket.

The scenario runs twice. First as users run it, a real process on ``--fake-nvml``: the fake NVML
lives in that process, so what NVML holds is seen as the kernel driver shows it to everyone, by
the capability files of each GPU and compute instance under ``/proc/driver/nvidia/capabilities``
of the driver root (the fake "driver" writes them when an instance is created, removes them when
it is destroyed). Then in this process through ``serving_dra``, where the fake NVML's own GPU and
compute instances are read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.errors import KubeletError
from devplug.testing import AllocationError, FakeKubeAPI, FakeKubelet, serving_dra
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from tests.nvidia.nvidia_dra_kit import nvidia_env
from tests.support import logged_process

pytestmark = pytest.mark.anyio

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
MODEL = "mig-mixed"  # GPUs 0-2: MIG on with instances; GPU 3: MIG on, none; GPU 4: MIG off
EMPTY = 3
CDI_KIND = "k8s.gpu.nvidia.com/claim"
# What NVIDIA's counter set holds (nvidia-dra.md §3): one counter per MIG capacity, as a DNS label,
# and one per memory slice.
COUNTERS = [
    "multiprocessors",
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
    "memory",
]


def _slice_writes_refused(api: FakeKubeAPI) -> list[tuple[str, str, int]]:
    return [
        (r.verb, r.path, r.status)
        for r in api.requests
        if "/resourceslices" in r.path and r.verb in ("create", "update", "patch") and r.status >= 400
    ]


def _check_slices(
    slices: list[dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The published pool as Kubernetes 1.35 wants it; its counter sets and devices by name."""
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"]) for s in slices}
    assert pools == {(NODE, slices[0]["spec"]["pool"]["generation"])}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    sets: dict[str, dict[str, Any]] = {}
    devices: dict[str, dict[str, Any]] = {}
    for s in slices:
        spec = s["spec"]
        assert spec["nodeName"] == NODE
        shared = spec.get("sharedCounters") or []
        found = spec.get("devices") or []
        assert bool(shared) != bool(found), "a slice carries counter sets or devices, never both (1.35)"
        assert len(shared) <= 8
        assert len(found) <= 64  # some consume counters: 64, not 128
        sets.update((c["name"], c["counters"]) for c in shared)
        for d in found:
            assert d["name"] not in devices, f"{d['name']} twice in the pool"
            devices[d["name"]] = d
    # Every consumption names a published counter set and counters it has.
    for d in devices.values():
        for consumption in d.get("consumesCounters") or []:
            counters = sets[consumption["counterSet"]]
            assert set(consumption["counters"]) <= set(counters), d["name"]
    return sets, devices


# The GPU and compute instances of a GPU: ``["gi<G>", "gi<G>/ci<C>", ...]``.
Instances = Callable[[int], list[str]]


def _capabilities(root: Path, gpu: int = EMPTY) -> list[str]:
    """The GPU and compute instances the driver shows for ``gpu`` (its capability files)."""
    mig = root / "proc/driver/nvidia/capabilities" / f"gpu{gpu}" / "mig"
    return sorted(str(p.parent.relative_to(mig)) for p in mig.glob("gi*/**/access"))


def _held(fake: FakeNvml, gpu: int = EMPTY) -> list[str]:
    """The GPU and compute instances the fake NVML holds for ``gpu``."""
    out = []
    for gi in fake.devices[gpu].instances:
        out += [f"gi{gi.id}", *(f"gi{gi.id}/ci{ci.id}" for ci in gi.compute_instances)]
    return sorted(out)


async def _scenario(
    api: FakeKubeAPI, kubelet: FakeKubelet, cdi: Path, state: Path, instances: Instances
) -> None:
    """Publish, prepare, refuse an overlapping placement (the scheduler) and an occupied one (the
    driver), unprepare (the driver is up)."""
    await kubelet.wait_for_usable(DRIVER, timeout=30)
    # GPUs 0-3: 28 MIG devices each (7 1g.5gb, 7 1g.5gb+me, 7 1g.10gb, 3 2g, 2 3g, 1 4g, 1 7g);
    # GPU 4 whole: 113 devices in 64 + 49, after one slice of the 4 counter sets.
    published = await api.wait_for_slices(node=NODE, driver=DRIVER, count=3, timeout=30)
    assert _slice_writes_refused(api) == []
    sets, devices = _check_slices(published)
    assert sorted(len(s["spec"].get("devices") or []) for s in published) == [0, 49, 64]
    assert len(devices) == 4 * 28 + 1
    assert sorted(sets) == [f"gpu-{i}-counter-set" for i in range(4)]
    for counters in sets.values():
        assert sorted(counters) == sorted(COUNTERS + [f"memory-slice-{i}" for i in range(7)])
    assert {k: v["value"] for k, v in sets["gpu-3-counter-set"].items() if "slice" not in k} == {
        "multiprocessors": "98",
        "copy-engines": "7",
        "decoders": "5",
        "encoders": "0",
        "jpeg-engines": "1",
        "ofa-engines": "1",
        "memory": "40192Mi",
    }
    two = devices["gpu-3-mig-2g10gb-1-2"]
    assert two["attributes"]["type"] == {"string": "mig"}
    assert two["attributes"]["profile"] == {"string": "2g.10gb"}
    assert "uuid" not in two["attributes"]
    assert two["consumesCounters"] == [
        {
            "counterSet": "gpu-3-counter-set",
            "counters": {
                "multiprocessors": {"value": "28"},
                "copy-engines": {"value": "2"},
                "decoders": {"value": "1"},
                "encoders": {"value": "0"},
                "jpeg-engines": {"value": "0"},
                "ofa-engines": {"value": "0"},
                "memory": {"value": "9856Mi"},
                "memory-slice-2": {"value": "1"},
                "memory-slice-3": {"value": "1"},
            },
        }
    ]
    assert "consumesCounters" not in devices["gpu-4"]
    assert instances(EMPTY) == []

    # One 2g.10gb at memory slices 2-3 of the empty GPU: created at prepare.
    api.add_claim("ns", "first", requests=[("mig", ["gpu-3-mig-2g10gb-1-2"])])
    first = api.allocate_claim("ns", "first", node=NODE, driver=DRIVER)["metadata"]["uid"]
    results = await kubelet.prepare(DRIVER, [("ns", "first", first)])
    assert [(d.device, d.cdi_device_ids) for d in results[first].devices] == [
        ("gpu-3-mig-2g10gb-1-2", (f"{CDI_KIND}={first}-gpu-3-mig-2g10gb-1-2",))
    ]
    made = instances(EMPTY)
    assert len(made) == 2 and made[1] == f"{made[0]}/ci0"  # one GPU instance, its compute instance
    gi = int(made[0].removeprefix("gi"))
    spec = yaml.safe_load((cdi / f"k8s.gpu.nvidia.com-claim_{first}.yaml").read_text())
    (device,) = spec["devices"]
    assert device["name"] == f"{first}-gpu-3-mig-2g10gb-1-2"
    paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    assert paths[0] == "/dev/nvidia3"
    assert len(paths) == 3 and all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths[1:])
    (created,) = json.loads((state / f"{first}.json").read_text())
    assert (created["device"], created["gpu_instance"], created["compute_instance"]) == (
        "gpu-3-mig-2g10gb-1-2",
        gi,
        0,
    )
    assert created["uuid"].startswith("MIG-")

    # A 1g.5gb at memory slice 3 overlaps it: the scheduler counts the counters the allocated
    # 2g.10gb consumes and does not allocate it.
    api.add_claim("ns", "overlap", requests=[("mig", ["gpu-3-mig-1g5gb-0-3"])])
    with pytest.raises(AllocationError) as overlap:
        api.allocate_claim("ns", "overlap", node=NODE, driver=DRIVER)
    assert str(overlap.value).endswith(
        "device gpu-3-mig-1g5gb-0-3: counter set gpu-3-counter-set: memory-slice-3 exhausted"
    )

    # What the scheduler cannot see: GPU 0's seven 1g.5gb instances, made outside any claim before
    # the driver started, hold every memory slice. A claim for a placement there is allocated; the
    # driver refuses it (NVML's Insufficient Resources) and leaves nothing behind.
    held = instances(0)
    assert len(held) == 14  # seven GPU instances, a compute instance each
    api.add_claim("ns", "second", requests=[("mig", ["gpu-0-mig-1g5gb-0-0"])])
    second = api.allocate_claim("ns", "second", node=NODE, driver=DRIVER)["metadata"]["uid"]
    with pytest.raises(KubeletError) as refused:
        await kubelet.prepare(DRIVER, [("ns", "second", second)])
    assert str(refused.value).endswith(
        "prepare of claim ns/second failed: gpu-0-mig-1g5gb-0-0: creating the GPU instance failed: "
        "nvmlDeviceCreateGpuInstanceWithPlacement failed: Insufficient Resources (NVML error 23)"
    )
    assert not (cdi / f"k8s.gpu.nvidia.com-claim_{second}.yaml").exists()
    assert not (state / f"{second}.json").exists()
    assert instances(EMPTY) == made
    assert instances(0) == held
    await kubelet.unprepare(DRIVER, [("ns", "second", second)])  # nothing to undo: no error

    # Unprepare destroys the instance and removes the spec.
    await kubelet.unprepare(DRIVER, [("ns", "first", first)])
    assert instances(EMPTY) == []
    assert not (state / f"{first}.json").exists()
    assert list(cdi.iterdir()) == []
    assert _slice_writes_refused(api) == []


async def test_the_driver_process_creates_and_destroys_mig_devices_for_claims(short_dir: Path) -> None:
    root = write_root(MODELS[MODEL], short_dir / "root")
    kubelet_root = short_dir / "k"
    registry = kubelet_root / "plugins_registry"
    registry.mkdir(parents=True)  # the kubelet's, made by its plugin watcher
    cdi = short_dir / "cdi"
    async with (
        FakeKubeAPI() as api,
        FakeKubelet(
            short_dir / "dp", plugins_registry_dir=registry, dra=True, kube_api=api, node_name=NODE
        ) as kubelet,
    ):
        api.add_node(NODE)
        args = [
            "--api", "dra", "--fake-nvml", MODEL, "--nvidia-driver-root", str(root),
            "--feature-gates", "DynamicMIG=true",
            "--kubeconfig", str(api.write_kubeconfig(short_dir / "kc")), "--kubelet-root", str(kubelet_root),
            "--cdi-root", str(cdi),
        ]  # fmt: skip
        async with logged_process("devplug_nvidia", args, short_dir / "log", env=nvidia_env(NODE_NAME=NODE)):
            state = kubelet_root / "plugins" / DRIVER / "dynamic-mig"
            await _scenario(api, kubelet, cdi, state, lambda gpu: _capabilities(root, gpu))
        # SIGTERM ended it with status 0 (logged_process checks); the sockets are gone.
        assert list(registry.iterdir()) == []
        assert not (kubelet_root / "plugins" / DRIVER / "dra.sock").exists()
    # Nothing went wrong but the refused claim: no slice write was refused, retried or cut short.
    events = [json.loads(line) for line in (short_dir / "log").read_text().splitlines()]
    assert [
        (e["level"], e["event"], e.get("claim")) for e in events if e["level"] not in ("debug", "info")
    ] == [("error", "prepare_failed", "ns/second")]


async def test_in_process_the_fake_nvml_holds_the_claims_instance(short_dir: Path) -> None:
    root = write_root(MODELS[MODEL], short_dir / "root")
    kubelet_root = short_dir / "k"
    registry = kubelet_root / "plugins_registry"
    registry.mkdir(parents=True)  # the kubelet's, made by its plugin watcher
    settings = NvidiaSettings(
        driver_root=str(root), driver_name=DRIVER, feature_gates="DynamicMIG=true", kubelet_root=kubelet_root
    )
    fake = FakeNvml(MODELS[MODEL])
    fake.proc_root = root / "proc"  # where the fake "driver" shows the instances it creates
    plugin = NvidiaDraPlugin.discover(settings, module=fake, sysfs=root / "sys", proc=root / "proc")
    async with (
        FakeKubeAPI() as api,
        FakeKubelet(
            short_dir / "dp", plugins_registry_dir=registry, dra=True, kube_api=api, node_name=NODE
        ) as kubelet,
        serving_dra(plugin, api, kubelet_root, node_name=NODE) as driver,
    ):
        state = settings.dra_plugins_dir / DRIVER / "dynamic-mig"
        await _scenario(api, kubelet, kubelet_root / "cdi", state, lambda gpu: _held(fake, gpu))
        assert _capabilities(root) == []  # and what the driver shows agrees
    assert not driver.dra_socket.exists()
    assert list(registry.iterdir()) == []
