"""devplug-nvidia as a DRA driver: NVIDIA's opaque configs through FakeKubelet's DRA mode:
time-slicing and MPS applied at prepare and undone at unprepare, bad configs refused per claim
(nvidia-dra.md §5, §6)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.testing import FakeKubeAPI, FakeKubelet, serving_dra
from devplug_nvidia._dra import _mps as _dra_mps
from devplug_nvidia._dra import _sharing as _dra_sharing
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from tests.nvidia.nvidia_dra_kit import dra_cluster

pytestmark = pytest.mark.anyio

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
API = "resource.nvidia.com/v1beta1"
DEFAULT, EXCLUSIVE_PROCESS = 0, 3
ALL_SHARING = "TimeSlicingSettings=true,MPSSupport=true"


def write_tools(root: Path) -> Path:
    """Fake ``nvidia-smi`` and ``nvidia-cuda-mps-control`` in the driver root; they log what
    they are asked to ``<root>/tools.log``. The control program keeps a marker in the pipe
    directory while its "daemon" runs, and answers as the real one does without it."""
    log = root / "tools.log"
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "nvidia-smi $*" >> "{log}"\n')
    control = root / "usr/bin/nvidia-cuda-mps-control"
    control.write_text(
        "#!/bin/sh\n"
        'pipe="$CUDA_MPS_PIPE_DIRECTORY"\n'
        'ident="$(basename "$(dirname "$pipe")")"\n'
        'if [ "$1" = "-d" ]; then\n'
        f'  echo "start $ident $CUDA_VISIBLE_DEVICES log=$CUDA_MPS_LOG_DIRECTORY" >> "{log}"\n'
        '  touch "$pipe/daemon"; exit 0\n'
        "fi\n"
        "read -r command\n"
        'if [ ! -e "$pipe/daemon" ]; then echo "Cannot find MPS control daemon process" >&2; exit 1; fi\n'
        f'echo "$ident: $command" >> "{log}"\n'
        'case "$command" in quit) rm "$pipe/daemon";; get_default_active_thread_percentage) echo 100;; esac\n'
    )
    for tool in (smi, control):
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return log


@dataclass
class Node:
    api: FakeKubeAPI
    kubelet: FakeKubelet
    plugin: NvidiaDraPlugin
    nvml: FakeNvml
    root: Path
    plugin_dir: Path
    cdi: Path

    def claim(
        self,
        name: str,
        requests: list[tuple[str, list[str]]],
        config: list[dict[str, Any]] | None = None,
    ) -> tuple[str, str, str]:
        """A claim for the named devices per request, allocated with ``config``; its reference."""
        self.api.add_claim("ns", name, requests=list(requests))
        claim = self.api.allocate_claim("ns", name, node=NODE, driver=DRIVER, config=config)
        return ("ns", name, str(claim["metadata"]["uid"]))

    async def error_of(self, ref: tuple[str, str, str]) -> str:
        results = await self.kubelet.prepare_raw(DRIVER, [ref])
        return results[ref[2]].error

    def spec(self, uid: str) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load((self.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").read_text())
        return doc

    def tool_log(self) -> list[str]:
        path = self.root / "tools.log"
        return path.read_text().splitlines() if path.exists() else []

    def uuid(self, index: int) -> str:
        return self.nvml.devices[index].uuid

    def mode(self, index: int) -> int:
        return self.nvml.devices[index].compute_mode


@asynccontextmanager
async def node(model: str, short_dir: Path, gates: str = ALL_SHARING) -> AsyncIterator[Node]:
    root = write_root(MODELS[model], short_dir / "root")
    write_tools(root)
    kubelet_root = short_dir / "k"
    settings = NvidiaSettings(
        driver_root=str(root), driver_name=DRIVER, kubelet_root=kubelet_root, feature_gates=gates
    )
    nvml = FakeNvml(MODELS[model])
    plugin = NvidiaDraPlugin.discover(settings, module=nvml, sysfs=root / "sys", proc=root / "proc")
    async with (
        dra_cluster(short_dir) as (api, kubelet, kubelet_root),
        serving_dra(plugin, api, kubelet_root, node_name=NODE),
    ):
        await kubelet.wait_for_usable(DRIVER, timeout=10)
        await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)
        yield Node(api, kubelet, plugin, nvml, root, kubelet_root / "plugins" / DRIVER, kubelet_root / "cdi")


def gpu_config(
    sharing: dict[str, Any] | None = None, *, kind: str = "GpuConfig", **more: Any
) -> dict[str, Any]:
    """Opaque parameters of ``kind`` with ``sharing``."""
    return {"apiVersion": API, "kind": kind, **({"sharing": sharing} if sharing else {}), **more}


def entry(
    parameters: dict[str, Any], requests: list[str] | None = None, source: str = "FromClaim"
) -> dict[str, Any]:
    """A ``status.allocation.devices.config`` entry for this driver."""
    return {
        "source": source,
        **({"requests": requests} if requests else {}),
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }


# -- time-slicing --------------------------------------------------------------------------------


async def test_time_slicing_sets_compute_mode_and_interval_and_unprepare_resets_them(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:
        n.nvml.devices[3].compute_mode = EXCLUSIVE_PROCESS
        config = [entry(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))]
        ref = n.claim("ts", [("gpu", ["gpu-3", "gpu-5"])], config)
        results = await n.kubelet.prepare(DRIVER, [ref])
        assert [d.device for d in results[ref[2]].devices] == ["gpu-3", "gpu-5"]
        assert (n.mode(3), n.mode(5)) == (DEFAULT, DEFAULT)
        assert n.nvml.calls.count("nvmlDeviceSetComputeMode") == 2
        first, second = sorted([n.uuid(3), n.uuid(5)])
        assert n.tool_log() == [
            f"nvidia-smi compute-policy -i {first} --set-timeslice 3",
            f"nvidia-smi compute-policy -i {second} --set-timeslice 3",
        ]
        # No sharing edits in the spec: time-slicing is a setting of the GPU.
        spec = n.spec(ref[2])
        assert all("env" not in d["containerEdits"] for d in spec["devices"])
        await n.kubelet.unprepare(DRIVER, [ref])
        assert n.tool_log()[2:] == [
            f"nvidia-smi compute-policy -i {first} --set-timeslice 0",
            f"nvidia-smi compute-policy -i {second} --set-timeslice 0",
        ]
        assert not (n.plugin_dir / "sharing" / f"{ref[2]}.json").exists()


async def test_a_missing_or_empty_time_slicing_block_means_default(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:
        for name, sharing in (
            ("missing", {"strategy": "TimeSlicing"}),
            ("empty", {"strategy": "TimeSlicing", "timeSlicingConfig": {}}),  # NVIDIA crashes here
        ):
            device = "gpu-1" if name == "missing" else "gpu-2"
            ref = n.claim(name, [("gpu", [device])], [entry(gpu_config(sharing))])
            await n.kubelet.prepare(DRIVER, [ref])
            assert n.tool_log()[-1].endswith("--set-timeslice 0")


async def test_a_mig_device_config_asking_for_time_slicing_changes_nothing(short_dir: Path) -> None:
    # NVIDIA accepts it (MigDeviceConfig has no interval) and sets nothing.
    async with node("mig-mixed", short_dir) as n:
        config = [entry(gpu_config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig"))]
        ref = n.claim("mig", [("mig", ["gpu-1-mig-2g10gb-1-4"])], config)
        results = await n.kubelet.prepare(DRIVER, [ref])
        assert results[ref[2]].devices[0].device == "gpu-1-mig-2g10gb-1-4"
        assert n.tool_log() == []
        assert "nvmlDeviceSetComputeMode" not in n.nvml.calls


async def test_a_config_without_requests_applies_only_to_its_device_type(short_dir: Path) -> None:
    async with node("mig-mixed", short_dir) as n:
        config = [entry(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}))]
        ref = n.claim("mixed", [("gpu", ["gpu-1-mig-2g10gb-1-4", "gpu-4"])], config)
        await n.kubelet.prepare(DRIVER, [ref])
        gpu4 = next(d for d in n.nvml.devices if d.index == 4)
        assert n.tool_log() == [f"nvidia-smi compute-policy -i {gpu4.uuid} --set-timeslice 1"]


async def test_claim_configs_override_class_configs_and_later_entries_win(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:

        def ts(interval: str) -> dict[str, Any]:
            return gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})

        config = [
            entry(ts("Medium"), source="FromClaim"),
            entry(ts("Long"), requests=["b"], source="FromClaim"),
            entry(ts("Short"), source="FromClass"),
            entry(ts("Default"), requests=["a"], source="FromClass"),
        ]
        ref = n.claim("prec", [("a", ["gpu-0"]), ("b", ["gpu-1"]), ("c", ["gpu-2"])], config)
        await n.kubelet.prepare(DRIVER, [ref])
        # Class configs come first whatever their place in the list; scanning from the last claim
        # config, gpu-0 ("a") takes the first config it meets without requests (the class config
        # naming "a" comes later); gpu-1 ("b") meets the config naming it first.
        assert sorted(n.tool_log()) == sorted(
            [
                f"nvidia-smi compute-policy -i {n.uuid(0)} --set-timeslice 2",
                f"nvidia-smi compute-policy -i {n.uuid(1)} --set-timeslice 3",
                f"nvidia-smi compute-policy -i {n.uuid(2)} --set-timeslice 2",
            ]
        )


# -- MPS -----------------------------------------------------------------------------------------


async def test_mps_starts_one_daemon_per_group_and_unprepare_stops_it(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:
        mps = {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "5Gi"},
            },
        }
        ref = n.claim("mps", [("gpu", ["gpu-2", "gpu-6"])], [entry(gpu_config(mps))])
        uid = ref[2]
        await n.kubelet.prepare(DRIVER, [ref])
        uuids = sorted([n.uuid(2), n.uuid(6)])
        ident = _dra_sharing.daemon_id(uid, uuids)
        root = n.plugin_dir / "mps" / ident
        assert ident.startswith(f"{uid}-") and len(ident) == len(uid) + 6
        assert n.tool_log() == [
            f"start {ident} {','.join(uuids)} log={root / 'log'}",
            f"{ident}: set_default_active_thread_percentage 50",
            f"{ident}: set_default_device_pinned_mem_limit {uuids[0]} 10240M",
            f"{ident}: set_default_device_pinned_mem_limit {uuids[1]} 5120M",
            f"{ident}: get_default_active_thread_percentage",
        ]
        assert (n.mode(2), n.mode(6)) == (EXCLUSIVE_PROCESS, EXCLUSIVE_PROCESS)
        assert (root / "pipe" / "daemon").exists()
        assert os.path.ismount(root / "shm") == (os.geteuid() == 0)
        for device in n.spec(uid)["devices"]:
            edits = device["containerEdits"]
            assert edits["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
            assert edits["mounts"] == [
                {
                    "hostPath": str(root / "shm"),
                    "containerPath": "/dev/shm",
                    "options": ["rw", "nosuid", "nodev", "bind"],
                },
                {
                    "hostPath": str(root / "pipe"),
                    "containerPath": "/tmp/nvidia-mps",
                    "options": ["rw", "nosuid", "nodev", "bind"],
                },
            ]
        state = json.loads((n.plugin_dir / "sharing" / f"{uid}.json").read_text())
        assert state == {"time_sliced": [], "daemons": [{"id": ident, "gpus": uuids}]}

        await n.kubelet.unprepare(DRIVER, [ref])
        assert n.tool_log()[-1] == f"{ident}: quit"
        assert not root.exists()
        assert (n.mode(2), n.mode(6)) == (DEFAULT, DEFAULT)
        assert not (n.plugin_dir / "sharing" / f"{uid}.json").exists()


async def test_an_unprepare_after_a_restart_stops_the_daemon_from_the_state_file(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:
        ref = n.claim("mps", [("gpu", ["gpu-4"])], [entry(gpu_config({"strategy": "MPS"}))])
        await n.kubelet.prepare(DRIVER, [ref])
        ident = _dra_sharing.daemon_id(ref[2], [n.uuid(4)])
        # A new process knows the claim only from the files under the plugin directory.
        del n.plugin.__dict__["sharing"]
        await n.kubelet.unprepare(DRIVER, [ref])
        assert n.tool_log()[-1] == f"{ident}: quit"
        assert not (n.plugin_dir / "mps" / ident).exists()
        assert n.mode(4) == DEFAULT


async def test_each_config_of_a_claim_gets_its_own_daemon(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:
        config = [
            entry(gpu_config({"strategy": "MPS"}), requests=["a"]),
            entry(
                gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}),
                requests=["b"],
            ),
        ]
        ref = n.claim("two", [("a", ["gpu-0"]), ("b", ["gpu-1"])], config)
        await n.kubelet.prepare(DRIVER, [ref])
        starts = [line.split()[1:3] for line in n.tool_log() if line.startswith("start ")]
        assert sorted(starts) == sorted(
            [
                [_dra_sharing.daemon_id(ref[2], [n.uuid(0)]), n.uuid(0)],
                [_dra_sharing.daemon_id(ref[2], [n.uuid(1)]), n.uuid(1)],
            ]
        )
        pipes = {d["name"]: d["containerEdits"]["mounts"][1]["hostPath"] for d in n.spec(ref[2])["devices"]}
        assert len(set(pipes.values())) == 2
        await n.kubelet.unprepare(DRIVER, [ref])
        assert list((n.plugin_dir / "mps").iterdir()) == []


async def test_mps_on_a_mig_device_leaves_its_parent_compute_mode(short_dir: Path) -> None:
    async with node("mig-mixed", short_dir) as n:
        config = [entry(gpu_config({"strategy": "MPS"}, kind="MigDeviceConfig"))]
        ref = n.claim("mig", [("mig", ["gpu-1-mig-2g10gb-1-4"])], config)
        await n.kubelet.prepare(DRIVER, [ref])
        assert [line.split()[2] for line in n.tool_log() if line.startswith("start ")] == [
            "MIG-774999e4-5749-5dc8-8b09-7bc10560fa87"
        ]
        assert "nvmlDeviceSetComputeMode" not in n.nvml.calls
        await n.kubelet.unprepare(DRIVER, [ref])


async def test_a_daemon_that_never_answers_fails_the_claim_and_is_cleaned_up(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_dra_mps, "_READY_DELAYS", (0.0,))
    async with node("dgx-a100", short_dir) as n:
        control = n.root / "usr/bin/nvidia-cuda-mps-control"
        # A daemon that starts but never creates its pipe marker: every question fails.
        control.write_text(control.read_text().replace('touch "$pipe/daemon"; exit 0', "exit 0"))
        ref = n.claim("dead", [("gpu", ["gpu-0"])], [entry(gpu_config({"strategy": "MPS"}))])
        error = await n.error_of(ref)
        assert "error applying config: MPS control daemon is not yet ready: " in error
        assert "Cannot find MPS control daemon process" in error
        assert list((n.plugin_dir / "mps").iterdir()) == []
        assert n.mode(0) == DEFAULT
        assert not (n.cdi / f"k8s.gpu.nvidia.com-claim_{ref[2]}.yaml").exists()


# -- refusals ------------------------------------------------------------------------------------


REFUSALS: list[tuple[str, list[dict[str, Any]], str]] = [
    (
        "unknown field",
        [entry(gpu_config({"strategy": "TimeSlicing", "foo": 1}))],
        "error getting opaque device configs: error decoding config parameters: "
        'strict decoding error: unknown field "sharing.foo"',
    ),
    (
        "wrong apiVersion",
        [entry({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"})],
        'no kind "GpuConfig" is registered for version "resource.nvidia.com/v1" in scheme',
    ),
    (
        "wrong kind",
        [entry({"apiVersion": API, "kind": "GPUConfig"})],
        'no kind "GPUConfig" is registered for version "resource.nvidia.com/v1beta1"',
    ),
    (
        "non-opaque",
        [{"source": "FromClaim", "opaque": None, "future": {"driver": DRIVER}}],
        "error getting opaque device configs: only opaque parameters are supported by this driver",
    ),
    (
        "unknown strategy",
        [entry(gpu_config({"strategy": "Exclusive"}))],
        "error validating GPU config: unknown GPU sharing strategy: Exclusive, supported GPU sharing "
        "strategies: TimeSlicing, MPS",
    ),
    (
        "unknown interval",
        [entry(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Huge"}}))],
        "error validating GPU config: unknown time-slice interval: Huge, supported time-slice intervals: "
        "Default, Short, Medium, Long",
    ),
    (
        "negative percentage",
        [entry(gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}))],
        "error validating GPU config: active thread percentage must not be negative",
    ),
    (
        "GpuConfig on a MIG device",
        [entry(gpu_config({"strategy": "TimeSlicing"}), requests=["gpu"])],
        'cannot apply GpuConfig to device "gpu-1-mig-2g10gb-1-4" of type "mig" (request: gpu)',
    ),
    (
        "bad device index",
        [
            entry(
                gpu_config(
                    {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}}
                ),
                requests=["x"],
            )
        ],
        "error applying config: error starting MPS control daemon: invalid device: invalid device index: 3",
    ),
    (
        "limit under 1 MiB",
        [
            entry(
                gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1000Ki"}}),
                requests=["x"],
            )
        ],
        "error applying config: error starting MPS control daemon: "
        "invalid limit: default value set too low: 1000Ki",
    ),
    (
        "limit over the device's memory",
        [
            entry(
                gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "200Gi"}}),
                requests=["x"],
            )
        ],
        "invalid limit: value set too high: ",
    ),
    (
        "TimeSlicingConfig with MPS",
        [entry(gpu_config({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}), requests=["x"])],
        "error applying config: error getting MPS configuration: "
        "cannot use TimeSlicingConfig with the 'MPS' strategy",
    ),
    (
        "MpsConfig with TimeSlicing on a GPU",
        [entry(gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}), requests=["x"])],
        "error applying config: error getting timeslice config for requests '[x]' in claim '{uid}': "
        "cannot use MpsConfig with the 'TimeSlicing' strategy",
    ),
]


async def test_bad_configs_fail_their_claim_only_and_the_driver_serves_on(short_dir: Path) -> None:
    async with node("mig-mixed", short_dir) as n:
        for i, (what, config, message) in enumerate(REFUSALS):
            ref = n.claim(f"bad-{i}", [("gpu", ["gpu-1-mig-2g10gb-1-4"]), ("x", ["gpu-4"])], config)
            error = await n.error_of(ref)
            assert error.startswith(f"prepare of claim ns/bad-{i} failed: "), what
            assert message.format(uid=ref[2]) in error, (what, error)
            assert not (n.cdi / f"k8s.gpu.nvidia.com-claim_{ref[2]}.yaml").exists()
            await n.kubelet.unprepare(DRIVER, [ref])
            n.api.delete_claim("ns", f"bad-{i}")  # its devices are free again
        assert n.tool_log() == []
        assert all(d.compute_mode == DEFAULT for d in n.nvml.devices)
        ref = n.claim("good", [("gpu", ["gpu-4"])], [entry(gpu_config({"strategy": "TimeSlicing"}))])
        results = await n.kubelet.prepare(DRIVER, [ref])
        assert results[ref[2]].devices[0].device == "gpu-4"


@pytest.mark.parametrize(
    ("gates", "strategy", "gate"),
    [
        ("MPSSupport=true", "TimeSlicing", "TimeSlicingSettings"),
        ("TimeSlicingSettings=true", "MPS", "MPSSupport"),
    ],
)
async def test_a_strategy_whose_gate_is_off_is_refused(
    short_dir: Path, gates: str, strategy: str, gate: str
) -> None:
    async with node("dgx-a100", short_dir, gates=gates) as n:
        ref = n.claim("off", [("gpu", ["gpu-0"])], [entry(gpu_config({"strategy": strategy}))])
        assert await n.error_of(ref) == (
            "prepare of claim ns/off failed: error validating GPU config: "
            f'"{strategy}" is selected as the GPU sharing strategy, '
            f'but the "{gate}" feature gate is not enabled'
        )


async def test_without_gates_a_claim_without_sharing_prepares_as_before(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir, gates="") as n:
        ref = n.claim("plain", [("gpu", ["gpu-0"])], [entry(gpu_config())])
        results = await n.kubelet.prepare(DRIVER, [ref])
        assert results[ref[2]].devices[0].device == "gpu-0"
        assert "nvmlDeviceSetComputeMode" not in n.nvml.calls
        assert not (n.plugin_dir / "sharing").exists()
        await n.kubelet.unprepare(DRIVER, [ref])
