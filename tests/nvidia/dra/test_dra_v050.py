"""devplug-nvidia --api dra as NVIDIA's DRA driver v0.5.0: consumable shares (published shared,
prepared per share), the NUMA and VFIO attributes, gpuModuleID from NVML, and each new flag and
gate either honoured or refused at start with one line (exit status 2)."""

from __future__ import annotations

import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.errors import ConfigError
from devplug.models import AllocatedDevice, Claim
from devplug.testing import FakeKubeAPI, FakeKubelet, serving_dra
from devplug_nvidia._config._feature_gates import GATES, FeatureGateError, parse_feature_gates
from devplug_nvidia._dra._support import check_supported, has_fabric_manager_fabric
from devplug_nvidia.config import NvidiaSettings, load_nvidia_settings
from devplug_nvidia.dra import NvidiaDraPlugin, run_dra, serving_settings
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from devplug_nvidia.testing._specs import MachineModel
from tests.nvidia.nvidia_dra_kit import dra_cluster, nvidia_env

pytestmark = pytest.mark.anyio

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
API = "resource.nvidia.com/v1beta1"
CDI_KIND = "k8s.gpu.nvidia.com/claim"
SHARES = "ConsumableShares=true"
TIME_SLICING = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}


def write_smi(root: Path) -> None:
    """An ``nvidia-smi`` in the driver root that logs its arguments to ``<root>/smi.log``."""
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$*" >> "{root / "smi.log"}"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


def smi_log(root: Path) -> list[str]:
    path = root / "smi.log"
    return path.read_text().splitlines() if path.exists() else []


def settings_for(root: Path, kubelet_root: Path, gates: str = "", **more: Any) -> NvidiaSettings:
    return NvidiaSettings(
        driver_root=str(root), driver_name=DRIVER, kubelet_root=kubelet_root, feature_gates=gates, **more
    )


def without_switches(model: MachineModel) -> MachineModel:
    """``model`` on a node whose NVLink fabric needs no Fabric Manager (no NVSwitch listed)."""
    return replace(model, switch_bus_ids=())


def with_modules(model: MachineModel) -> MachineModel:
    """``model`` whose GPUs report modules 1, 2, ... to NVML."""
    return replace(model, gpus=tuple(replace(g, module_id=i + 1) for i, g in enumerate(model.gpus)))


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
        *,
        capacity: dict[str, dict[str, str]] | None = None,
        sharing: dict[str, Any] | None = None,
    ) -> tuple[str, str, str]:
        """A claim for the named devices, allocated (shares where the devices are shared)."""
        self.api.add_claim("ns", name, requests=list(requests), capacity=capacity)
        config = None
        if sharing is not None:
            parameters = {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}
            config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]
        claim = self.api.allocate_claim("ns", name, node=NODE, driver=DRIVER, config=config)
        return ("ns", name, str(claim["metadata"]["uid"]))

    def results(self, ref: tuple[str, str, str]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = self.api.claim(ref[0], ref[1])["status"]["allocation"]["devices"][
            "results"
        ]
        return results

    def spec(self, uid: str) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load((self.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").read_text())
        return doc

    def published(self) -> dict[str, dict[str, Any]]:
        """The published devices by name."""
        return {d["name"]: d for s in self.api.slices(node=NODE, driver=DRIVER) for d in s["spec"]["devices"]}


@asynccontextmanager
async def node(model: str, short_dir: Path, gates: str = SHARES, **more: Any) -> AsyncIterator[Node]:
    root = write_root(MODELS[model], short_dir / "root")
    write_smi(root)
    kubelet_root = short_dir / "k"
    settings = settings_for(root, kubelet_root, gates, **more)
    nvml = FakeNvml(MODELS[model])
    plugin = NvidiaDraPlugin.discover(settings, module=nvml, sysfs=root / "sys", proc=root / "proc")
    async with (
        dra_cluster(short_dir) as (api, kubelet, kubelet_root),
        serving_dra(plugin, api, kubelet_root, node_name=NODE),
    ):
        await kubelet.wait_for_usable(DRIVER, timeout=10)
        await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)
        yield Node(api, kubelet, plugin, nvml, root, kubelet_root / "plugins" / DRIVER, kubelet_root / "cdi")


# -- consumable shares: what is published -----------------------------------------------------------

A10_MEMORY = "23028Mi"


@pytest.mark.parametrize(
    ("mode", "capacity"),
    [
        (
            "memory",
            {
                "memory": {
                    "value": A10_MEMORY,
                    "requestPolicy": {
                        "default": A10_MEMORY,
                        "validRange": {"min": "1Mi", "max": A10_MEMORY, "step": "1Mi"},
                    },
                }
            },
        ),
        (
            "unlimited",
            {
                "memory": {
                    "value": A10_MEMORY,
                    "requestPolicy": {
                        "default": "0",
                        "validRange": {"min": "0", "max": A10_MEMORY, "step": "1Mi"},
                    },
                }
            },
        ),
        (
            "4",
            {
                "memory": {
                    "value": A10_MEMORY,
                    "requestPolicy": {
                        "default": "0",
                        "validRange": {"min": "0", "max": A10_MEMORY, "step": "1Mi"},
                    },
                },
                "shares": {
                    "value": "4",
                    "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
                },
            },
        ),
    ],
)
async def test_gpus_are_published_shared_with_nvidias_capacities(
    short_dir: Path, mode: str, capacity: dict[str, Any]
) -> None:
    async with node("pcie-a10", short_dir, consumable_shares=mode) as n:
        devices = n.published()
        assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        for device in devices.values():
            assert device["allowMultipleAllocations"] is True
            assert device["capacity"] == capacity


def test_memory_is_rounded_down_to_a_whole_mib_when_shared(tmp_path: Path) -> None:
    from devplug.models import Device
    from devplug_nvidia._dra._shares import shared_device

    odd = Device(id="g", capacity={"memory": str(80 * 1024**3 + 12345)})
    shared = shared_device(odd, "memory")
    assert shared.capacity == {"memory": "80Gi"}
    assert shared.request_policies["memory"].max == "80Gi"


def test_static_mig_devices_are_shared_too(tmp_path: Path) -> None:
    root = write_root(MODELS["mig-uniform"], tmp_path / "root")
    settings = settings_for(root, tmp_path / "k", SHARES, consumable_shares="memory")
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(MODELS["mig-uniform"]), sysfs=root / "sys", proc=root / "proc"
    )
    mig = plugin.devices[0]
    assert mig.attributes["type"] == "mig"
    assert mig.allow_multiple_allocations
    # Only the memory has a policy, as NVIDIA's: the other capacities are taken whole by default.
    assert {k: p.as_dict() for k, p in mig.request_policies.items()} == {
        "memory": {"default": "4864Mi", "validRange": {"min": "1Mi", "max": "4864Mi", "step": "1Mi"}}
    }
    assert mig.capacity["multiprocessors"] == "14"


@pytest.mark.parametrize(
    ("gates", "mode"), [("", "disabled"), (SHARES, "disabled"), ("ConsumableShares=false", "disabled")]
)
def test_devices_are_not_shared_without_the_gate_and_a_mode(tmp_path: Path, gates: str, mode: str) -> None:
    root = write_root(MODELS["pcie-a10"], tmp_path / "root")
    settings = settings_for(root, tmp_path / "k", gates, consumable_shares=mode)
    assert settings.shares is None
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(MODELS["pcie-a10"]), sysfs=root / "sys", proc=root / "proc"
    )
    assert not any(d.allow_multiple_allocations or d.request_policies for d in plugin.devices)
    assert plugin.devices[0].capacity == {"memory": A10_MEMORY}


@pytest.mark.parametrize(
    ("gates", "value", "error"),
    [
        ("", "memory", "invalid CLI flags: --consumable-shares requires feature gate ConsumableShares"),
        ("", "bogus", "requires feature gate ConsumableShares to be enabled"),
        (SHARES, "bogus", "invalid value for --consumable-shares: \"bogus\" (must be 'disabled', 'memory'"),
        (SHARES, "0", 'invalid value for --consumable-shares: "0"'),
        (SHARES, "-2", 'invalid value for --consumable-shares: "-2"'),
        (SHARES, "", 'invalid value for --consumable-shares: ""'),
        (SHARES, " 4", 'invalid value for --consumable-shares: " 4"'),
    ],
)
def test_consumable_shares_values_are_checked_as_nvidia_checks_them(
    gates: str, value: str, error: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        NvidiaSettings(feature_gates=gates, consumable_shares=value)
    assert str(caught.value).startswith("invalid CLI flags: ")
    assert error in str(caught.value)


@pytest.mark.parametrize(("value", "shares"), [("memory", "memory"), ("unlimited", "unlimited"), ("+07", 7)])
def test_consumable_shares_come_from_the_flag_or_nvidias_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, shares: object
) -> None:
    monkeypatch.delenv("CONSUMABLE_SHARES", raising=False)
    flag = load_nvidia_settings(["--feature-gates", SHARES, "--consumable-shares", value])
    assert flag.shares == shares
    monkeypatch.setenv("CONSUMABLE_SHARES", value)
    monkeypatch.setenv("FEATURE_GATES", SHARES)
    assert load_nvidia_settings([]).shares == shares


# -- consumable shares: prepare ------------------------------------------------------------------


async def test_two_claims_get_shares_of_one_gpu_each_with_the_whole_device(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir, consumable_shares="unlimited") as n:
        first = n.claim("one", [("gpu", ["gpu-0"])], capacity={"gpu": {"memory": "4Gi"}})
        second = n.claim("two", [("gpu", ["gpu-0"])], capacity={"gpu": {"memory": "8Gi"}})
        shares = {ref[2]: n.results(ref)[0]["shareID"] for ref in (first, second)}
        assert len(set(shares.values())) == 2
        results = await n.kubelet.prepare(DRIVER, [first, second])
        for ref in (first, second):
            uid = ref[2]
            (device,) = results[uid].devices
            assert (device.device, device.share_id) == ("gpu-0", shares[uid])
            assert device.cdi_device_ids == (f"{CDI_KIND}={uid}-gpu-0",)
            # NVIDIA's share is the whole GPU: its device node, no limit of its own.
            (spec_device,) = n.spec(uid)["devices"]
            assert spec_device["containerEdits"] == {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": f"{n.root}/dev/nvidia0"}]
            }
            assert n.spec(uid)["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
        await n.kubelet.unprepare(DRIVER, [first])
        assert not (n.cdi / f"k8s.gpu.nvidia.com-claim_{first[2]}.yaml").exists()
        assert n.spec(second[2])["devices"][0]["name"] == f"{second[2]}-gpu-0"


async def test_two_shares_of_one_gpu_in_one_claim_are_one_cdi_device(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir, consumable_shares="4") as n:
        ref = n.claim("pair", [("a", ["gpu-1"]), ("b", ["gpu-1"])])
        results = await n.kubelet.prepare(DRIVER, [ref])
        devices = results[ref[2]].devices
        assert [(d.device, d.request_names) for d in devices] == [("gpu-1", ("a",)), ("gpu-1", ("b",))]
        assert len({d.share_id for d in devices}) == 2
        assert [d["name"] for d in n.spec(ref[2])["devices"]] == [f"{ref[2]}-gpu-1"]


async def test_a_shared_gpus_time_slice_is_reset_when_its_last_claim_goes(short_dir: Path) -> None:
    gates = f"{SHARES},TimeSlicingSettings=true"
    async with node("pcie-a10", short_dir, gates, consumable_shares="unlimited") as n:
        uuid = n.nvml.devices[2].uuid
        first = n.claim("one", [("gpu", ["gpu-2"])], sharing=TIME_SLICING)
        second = n.claim("two", [("gpu", ["gpu-2"])], sharing=TIME_SLICING)
        await n.kubelet.prepare(DRIVER, [first, second])
        assert smi_log(n.root) == [f"compute-policy -i {uuid} --set-timeslice 3"] * 2
        await n.kubelet.unprepare(DRIVER, [first])
        assert len(smi_log(n.root)) == 2  # the other claim still uses the GPU: left as it is
        await n.kubelet.unprepare(DRIVER, [second])
        assert smi_log(n.root)[2:] == [f"compute-policy -i {uuid} --set-timeslice 0"]


async def test_a_claim_with_another_config_for_a_shared_gpu_is_refused(short_dir: Path) -> None:
    gates = f"{SHARES},TimeSlicingSettings=true"
    async with node("pcie-a10", short_dir, gates, consumable_shares="unlimited") as n:
        sliced = n.claim("sliced", [("gpu", ["gpu-3"])], sharing=TIME_SLICING)
        plain = n.claim("plain", [("gpu", ["gpu-3"])])
        await n.kubelet.prepare(DRIVER, [sliced])
        error = (await n.kubelet.prepare_raw(DRIVER, [plain]))[plain[2]].error
        assert (
            f"unable to prepare claim {plain[2]}: requested device gpu-3 has conflicting configuration "
            f"with already prepared claim {sliced[2]}"
        ) in error
        # Once the first claim is gone, nothing conflicts.
        await n.kubelet.unprepare(DRIVER, [sliced])
        assert (await n.kubelet.prepare_raw(DRIVER, [plain]))[plain[2]].error == ""


async def test_mps_is_refused_with_consumable_shares(short_dir: Path) -> None:
    gates = f"{SHARES},MPSSupport=true"
    async with node("pcie-a10", short_dir, gates, consumable_shares="memory") as n:
        ref = n.claim("mps", [("gpu", ["gpu-0"])], sharing={"strategy": "MPS"})
        error = (await n.kubelet.prepare_raw(DRIVER, [ref]))[ref[2]].error
        assert (
            "error applying config: MPS sharing is not supported when consumable shares is enabled" in error
        )
        assert not list(n.cdi.glob("*.yaml"))


async def test_a_shared_dynamic_mig_device_is_created_once_and_destroyed_with_its_last_claim(
    tmp_path: Path,
) -> None:
    model = MODELS["mig-mixed"]
    root = write_root(model, tmp_path / "root")
    settings = settings_for(
        root,
        tmp_path / "k",
        f"{SHARES},DynamicMIG=true",
        consumable_shares="unlimited",
        cdi_dir=tmp_path / "cdi",
    )
    fake = FakeNvml(model)
    fake.proc_root = root / "proc"
    plugin = NvidiaDraPlugin.discover(settings, module=fake, sysfs=root / "sys", proc=root / "proc")
    name = "gpu-3-mig-3g20gb-2-4"
    device = next(d for d in plugin.devices if d.name == name)
    assert device.allow_multiple_allocations and device.consumes_counters

    def share(share_id: str, *others: str) -> list[AllocatedDevice]:
        return [
            AllocatedDevice(
                request="mig", name=name, pool=NODE, device=device, share_id=share_id, other_shares=others
            )
        ]

    def instances() -> list[int]:
        return [gi.id for gi in fake.devices[3].instances]

    one, two = Claim(uid="uid-1", namespace="ns", name="one"), Claim(uid="uid-2", namespace="ns", name="two")
    first = await plugin.prepare_claim(one, share("s-1"), [])
    second = await plugin.prepare_claim(two, share("s-2", "s-1"), [])
    assert len(instances()) == 1  # the second share uses the first's MIG device
    assert [p.share_id for p in (*first, *second)] == ["s-1", "s-2"]
    edits = []
    for prepared in (first, second):
        spec_file = prepared[0].cdi_spec_file
        assert spec_file is not None
        edits.append(yaml.safe_load(spec_file.text)["devices"][0]["containerEdits"])
    assert edits[0] == edits[1]  # the same MIG device: its capability nodes
    await plugin.unprepare_claim(one)
    assert len(instances()) == 1
    await plugin.unprepare_claim(two)
    await plugin.release_device(name)
    assert instances() == []


# -- NUMA and VFIO ----------------------------------------------------------------------------------


async def test_numa_node_is_kubernetes_int_and_no_vfio_or_numa_attribute(short_dir: Path) -> None:
    async with node("pcie-a10", short_dir, gates="") as n:
        devices = n.published()
        assert {d["attributes"]["type"]["string"] for d in devices.values()} == {"gpu"}
        assert not any("numa" in d["attributes"] for d in devices.values())
        assert [devices[f"gpu-{i}"]["attributes"]["resource.kubernetes.io/numaNode"] for i in range(4)] == [
            {"int": 0},
            {"int": 0},
            {"int": 1},
            {"int": 1},
        ]


# -- gates and flags --------------------------------------------------------------------------------


def test_nvidia_v050_gates_are_known_with_their_defaults() -> None:
    assert {
        name: GATES[name]
        for name in (
            "FabricManagerPartitioning",
            "HostManagedIMEXDaemon",
            "DRAListTypeAttributes",
            "ConsumableShares",
            "IMEXDaemonsWithDNSNames",
            "ComputeDomainCliques",
            "CrashOnNVLinkFabricErrors",
        )
    } == {
        "FabricManagerPartitioning": (False, "alpha"),
        "HostManagedIMEXDaemon": (False, "alpha"),
        "DRAListTypeAttributes": (False, "alpha"),
        "ConsumableShares": (False, "alpha"),
        "IMEXDaemonsWithDNSNames": (True, "beta"),
        "ComputeDomainCliques": (True, "beta"),
        "CrashOnNVLinkFabricErrors": (True, "beta"),
    }
    all_alpha = "AllAlpha=true,DynamicMIG=false,PassthroughSupport=false,DeviceMetadata=false"
    assert parse_feature_gates(all_alpha)["ConsumableShares"]


def test_compute_domain_cliques_needs_imex_daemons_with_dns_names() -> None:
    with pytest.raises(FeatureGateError, match="ComputeDomainCliques requires IMEXDaemonsWithDNSNames"):
        parse_feature_gates("IMEXDaemonsWithDNSNames=false")
    assert not parse_feature_gates("IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false")[
        "IMEXDaemonsWithDNSNames"
    ]


def test_compute_domain_gates_are_accepted_without_effect(tmp_path: Path) -> None:
    root = write_root(MODELS["pcie-a10"], tmp_path / "root")
    gates = (
        "HostManagedIMEXDaemon=true,CrashOnNVLinkFabricErrors=false,"
        "ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false"
    )
    plain, gated = (
        NvidiaDraPlugin.discover(
            settings_for(root, tmp_path / "k", g),
            module=FakeNvml(MODELS["pcie-a10"]),
            sysfs=root / "sys",
            proc=root / "proc",
        )
        for g in ("", gates)
    )
    assert gated.devices == plain.devices


@pytest.mark.parametrize(
    ("more", "line"),
    [
        (
            {"feature_gates": "PassthroughSupport=true"},
            "feature gate PassthroughSupport is not supported: devplug-nvidia publishes no VFIO devices",
        ),
        (
            {"feature_gates": "PassthroughSupport=true,DeviceMetadata=true"},
            "feature gate PassthroughSupport is not supported",
        ),
        ({"metrics_path": "/nvidia"}, "--metrics-path /nvidia is not supported: devplug-nvidia serves"),
        (
            {"service_account_name": "mps"},
            "--service-account-name is not supported: it sets the service account of NVIDIA's MPS "
            "control-daemon Deployments",
        ),
        (
            {"image_pull_secrets": "a,b"},
            "--image-pull-secrets is not supported: it sets the image pull secrets",
        ),
        (
            {"image_pull_policy": "Always"},
            "--image-pull-policy is not supported: it sets the image pull policy",
        ),
    ],
)
def test_what_devplug_does_not_do_is_refused_at_start_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: dict[str, Any], line: str
) -> None:
    root = write_root(MODELS["pcie-a10"], tmp_path / "root")
    settings = NvidiaSettings(driver_root=str(root), fake_nvml="pcie-a10", node_name=NODE, **more)
    assert run_dra(settings, "devplug-nvidia") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"devplug-nvidia: {line}")
    assert err.count("\n") == 1


@pytest.mark.parametrize("path", ["/metrics", "metrics", "//metrics/", ""])
def test_the_metrics_path_devplug_serves_is_accepted(path: str) -> None:
    settings = NvidiaSettings(metrics_path=path, metrics_address=":8080")
    check_supported(settings)
    assert settings.metrics_address == (None if path == "" else ":8080")


def test_nvidias_flags_and_variables_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HTTP_ENDPOINT", "METRICS_PATH", "HOST_ROOT", "SERVICE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    flags = load_nvidia_settings(
        ["--http-endpoint", ":9090", "--metrics-path", "metrics", "--host-root", str(tmp_path)]
    )
    assert (flags.metrics_address, flags.metrics_path, flags.host_root) == (":9090", "metrics", tmp_path)
    defaults = load_nvidia_settings([])
    assert (defaults.metrics_path, defaults.service_account_name, defaults.consumable_shares) == (
        "/metrics",
        "",
        "disabled",
    )
    monkeypatch.setenv("HTTP_ENDPOINT", "")  # NVIDIA's default: no metrics server
    assert load_nvidia_settings([]).metrics_address is None
    monkeypatch.setenv("HTTP_ENDPOINT", "127.0.0.1:8081")
    monkeypatch.setenv("HOST_ROOT", "/host-root")
    monkeypatch.setenv("SERVICE_ACCOUNT_NAME", "mps-sa")
    env = load_nvidia_settings([])
    assert (env.metrics_address, env.host_root, env.service_account_name) == (
        "127.0.0.1:8081",
        Path("/host-root"),
        "mps-sa",
    )
    monkeypatch.setenv("METRICS_PATH", "")  # NVIDIA serves nothing with an empty path
    assert load_nvidia_settings([]).metrics_address is None


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--consumable-shares", "memory"], "--consumable-shares requires feature gate ConsumableShares"),
        (["--service-account-name", "x"], "--service-account-name is not supported"),
    ],
)
def test_the_process_exits_2_with_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "devplug_nvidia", "--api", "dra", "--fake-nvml", "pcie-a10", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=nvidia_env(NODE_NAME=NODE),
    )
    assert proc.returncode == 2, proc.stderr
    assert line in proc.stderr
    assert proc.stderr.count("\n") == 1


# -- fabric partitions ------------------------------------------------------------------------------


def test_the_fake_nvml_reports_module_ids_where_the_machine_has_them() -> None:
    hgx = FakeNvml(MODELS["dgx-h100"])
    hgx.nvmlInit()
    assert [hgx.nvmlDeviceGetModuleId(hgx.nvmlDeviceGetHandleByIndex(i)) for i in range(8)] == list(
        range(1, 9)
    )
    pcie = FakeNvml(MODELS["pcie-a10"])
    pcie.nvmlInit()
    with pytest.raises(pcie.NVMLError_NotSupported):
        pcie.nvmlDeviceGetModuleId(pcie.nvmlDeviceGetHandleByIndex(0))


def test_gpu_module_id_is_published_with_the_gate(tmp_path: Path) -> None:
    model = without_switches(MODELS["dgx-h100"])
    root = write_root(model, tmp_path / "root")

    def devices(gates: str) -> list[Any]:
        settings = settings_for(root, tmp_path / "k", gates)
        plugin = NvidiaDraPlugin.discover(
            settings, module=FakeNvml(model), sysfs=root / "sys", proc=root / "proc"
        )
        return plugin.devices

    gated = devices("FabricManagerPartitioning=true")
    assert [d.attributes["gpuModuleID"] for d in gated] == list(range(1, 9))
    assert not any(name.startswith("partition") for d in gated for name in d.attributes)
    assert not any("gpuModuleID" in d.attributes for d in devices(""))


def test_mig_devices_carry_no_module_id(tmp_path: Path) -> None:
    model = with_modules(MODELS["mig-mixed"])
    root = write_root(model, tmp_path / "root")
    settings = settings_for(root, tmp_path / "k", "FabricManagerPartitioning=true")
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(model), sysfs=root / "sys", proc=root / "proc"
    )
    by_type = {str(d.attributes["type"]): d for d in plugin.devices}
    assert by_type["gpu"].attributes["gpuModuleID"] == 5  # gpu-4, MIG off
    assert "gpuModuleID" not in by_type["mig"].attributes


def test_the_fabric_gate_is_refused_on_a_node_with_nvswitches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_root(MODELS["dgx-h100"], tmp_path / "root")
    assert has_fabric_manager_fabric(proc=root / "proc", sysfs=root / "sys")
    settings = NvidiaSettings(
        driver_root=str(root),
        fake_nvml="dgx-h100",
        node_name=NODE,
        feature_gates="FabricManagerPartitioning=true",
    )
    assert run_dra(settings, "devplug-nvidia") == 2
    err = capsys.readouterr().err
    assert err == (
        "devplug-nvidia: feature gate FabricManagerPartitioning is not supported yet on a node with an "
        "NVSwitch fabric: devplug-nvidia does not talk to Fabric Manager (no partition<N> attributes, "
        "no partition activated at prepare)\n"
    )


def test_an_nvlink5_switch_managed_fabric_is_found_in_the_infiniband_vpd(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    vpd = sysfs / "class/infiniband/mlx5_0/device/vpd"
    vpd.parent.mkdir(parents=True)
    vpd.write_bytes(b"\x82\x10ConnectX-7\x90PN SN V0 OTHER")
    assert not has_fabric_manager_fabric(proc=proc, sysfs=sysfs)
    vpd.write_bytes(b"\x82\x10ConnectX-7\x90PN V3 SW_MNG")
    assert has_fabric_manager_fabric(proc=proc, sysfs=sysfs)
    assert not has_fabric_manager_fabric(proc=proc, sysfs=tmp_path / "none")


# -- DRAListTypeAttributes ---------------------------------------------------------------------------


def test_the_list_type_attributes_gate_publishes_numa_node_as_a_list(tmp_path: Path) -> None:
    """NVIDIA's gate turns devplug's list attributes on: numaNode as a list of ints, as NVIDIA
    publishes it (where the cluster has DRAListTypeAttributes; see tests/dra for a server
    without it)."""
    root = write_root(MODELS["pcie-a10"], tmp_path / "root")
    plain = settings_for(root, tmp_path / "k")
    gated = settings_for(root, tmp_path / "k", "DRAListTypeAttributes=true")
    assert serving_settings(plain).list_attributes is False
    served = serving_settings(gated)
    assert (served.list_attributes, served.driver_name) == (True, DRIVER)
    plugin = NvidiaDraPlugin.discover(
        gated, module=FakeNvml(MODELS["pcie-a10"]), sysfs=root / "sys", proc=root / "proc"
    )
    from devplug._dra.inventory import Inventory
    from devplug._dra.slices import device_entry

    inventory = Inventory([plugin])
    inventory.update(0, plugin.devices)
    entry = next(e for e in inventory.current.entries if e.device.numa_nodes)
    numa = device_entry(entry, DRIVER, taint_unhealthy=True, lists=True)["attributes"][
        "resource.kubernetes.io/numaNode"
    ]
    assert numa == {"ints": list(entry.device.numa_nodes)}
