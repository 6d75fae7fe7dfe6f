"""Dynamic MIG the whole way, as a cluster runs it: ``devplug-nvidia --api dra --feature-gates
DynamicMIG=true`` as a real process on the fake NVML, publishing to a FakeKubeAPI, registered
through the plugin watcher's directory, with claims prepared and unprepared over the DRA socket.

The fake NVML lives in the driver's process, so what NVML holds is seen as the kernel driver shows
it to everyone: the capability files of each GPU and compute instance under
``/proc/driver/nvidia/capabilities`` of the driver root, which the fake "driver" writes when an
instance is created and removes when it is destroyed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.testing import FakeKubeAPI
from devplug_nvidia.testing import MODELS, write_root
from tests.dra.dra_kit import notify, prepare, unprepare
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
_NVIDIA_ENV = (
    "MIG_STRATEGY",
    "CONFIG_FILE",
    "NVIDIA_DRIVER_ROOT",
    "DEVPLUG_FAKE_NVML",
    "NODE_NAME",
    "CDI_ROOT",
    "KUBELET_REGISTRAR_DIRECTORY_PATH",
    "FEATURE_GATES",
)


def _env(**extra: str) -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in _NVIDIA_ENV and not k.startswith("DEVPLUG_")
    } | extra


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


def _capabilities(root: Path, gpu: int) -> list[str]:
    """The GPU and compute instances the driver shows for ``gpu`` (``gi<G>``, ``gi<G>/ci<C>``)."""
    mig = root / "proc/driver/nvidia/capabilities" / f"gpu{gpu}" / "mig"
    return sorted(str(p.parent.relative_to(mig)) for p in mig.glob("gi*/**/access"))


async def test_dynamic_mig_publishes_prepares_and_unprepares_through_the_api_server(short_dir: Path) -> None:
    root = write_root(MODELS[MODEL], short_dir / "root")
    kubelet = short_dir / "k"
    (kubelet / "plugins_registry").mkdir(parents=True)  # the kubelet's, made by its plugin watcher
    cdi = short_dir / "cdi"
    state = kubelet / "plugins" / DRIVER / "dynamic-mig"
    before = _capabilities(root, EMPTY)
    assert before == []
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        args = [
            "--api", "dra", "--fake-nvml", MODEL, "--nvidia-driver-root", str(root),
            "--feature-gates", "DynamicMIG=true",
            "--kubeconfig", str(api.write_kubeconfig(short_dir / "kc")), "--kubelet-root", str(kubelet),
            "--cdi-root", str(cdi),
        ]  # fmt: skip
        async with logged_process("devplug_nvidia", args, short_dir / "log", env=_env(NODE_NAME=NODE)):
            # GPUs 0-3: 28 MIG devices each (7 1g.5gb, 7 1g.5gb+me, 7 1g.10gb, 3 2g, 2 3g, 1 4g,
            # 1 7g); GPU 4 whole: 113 devices in 64 + 49, after one slice of the 4 counter sets.
            published = await api.wait_for_slices(node=NODE, driver=DRIVER, count=3, timeout=30)
            assert _slice_writes_refused(api) == []
            sets, devices = _check_slices(published)
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

            await notify(kubelet / "plugins_registry" / f"{DRIVER}-reg.sock")
            dra_socket = kubelet / "plugins" / DRIVER / "dra.sock"

            # One 2g.10gb at memory slices 2-3 of the empty GPU: created at prepare.
            api.add_claim("ns", "first", requests=[("mig", ["gpu-3-mig-2g10gb-1-2"])])
            first = api.allocate_claim("ns", "first", node=NODE, driver=DRIVER)["metadata"]["uid"]
            answer = (await prepare(dra_socket, ("ns", "first", first)))[first]
            assert answer.error == ""
            assert [list(d.cdi_device_ids) for d in answer.devices] == [
                [f"{CDI_KIND}={first}-gpu-3-mig-2g10gb-1-2"]
            ]
            made = _capabilities(root, EMPTY)
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

            # A 1g.5gb at memory slice 3 overlaps it. This scheduler does not count counters, so
            # the claim is allocated; the driver refuses it and leaves nothing behind.
            api.add_claim("ns", "second", requests=[("mig", ["gpu-3-mig-1g5gb-0-3"])])
            second = api.allocate_claim("ns", "second", node=NODE, driver=DRIVER)["metadata"]["uid"]
            refused = (await prepare(dra_socket, ("ns", "second", second)))[second]
            assert "gpu-3-mig-1g5gb-0-3: creating the GPU instance failed" in refused.error
            assert "Insufficient Resources" in refused.error
            assert list(refused.devices) == []
            assert not (cdi / f"k8s.gpu.nvidia.com-claim_{second}.yaml").exists()
            assert not (state / f"{second}.json").exists()
            assert _capabilities(root, EMPTY) == made
            assert (await unprepare(dra_socket, ("ns", "second", second)))[second].error == ""

            # Unprepare destroys the instance and removes the spec.
            assert (await unprepare(dra_socket, ("ns", "first", first)))[first].error == ""
            assert _capabilities(root, EMPTY) == []
            assert not (state / f"{first}.json").exists()
            assert list(cdi.iterdir()) == []
            assert _slice_writes_refused(api) == []
        # SIGTERM ended it with status 0 (logged_process checks); the sockets are gone.
        assert not (kubelet / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
        assert not dra_socket.exists()
