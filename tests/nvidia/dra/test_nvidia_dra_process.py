"""``devplug-nvidia --api dra`` as a real process on the fake NVML, against a FakeKubeAPI."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
import yaml

from devplug.testing import FakeKubeAPI, run_dra_conformance
from devplug_nvidia.testing import MODELS, write_root
from tests.dra.dra_kit import notify, prepare, unprepare
from tests.nvidia.nvidia_dra_kit import nvidia_env
from tests.support import logged_process

pytestmark = pytest.mark.anyio

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


async def test_dgx_a100_publishes_prepares_and_exits_on_sigterm(short_dir: Path) -> None:
    root = write_root(MODELS["dgx-a100"], short_dir / "root")
    kubelet = short_dir / "k"
    (kubelet / "plugins_registry").mkdir(parents=True)  # the kubelet's, made by its plugin watcher
    cdi = short_dir / "cdi"
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        args = [
            "--api", "dra", "--fake-nvml", "dgx-a100", "--nvidia-driver-root", str(root),
            "--kubeconfig", str(api.write_kubeconfig(short_dir / "kc")), "--kubelet-root", str(kubelet),
            "--cdi-root", str(cdi),
        ]  # fmt: skip
        # The node's name as NVIDIA's DaemonSet gives it: NODE_NAME.
        async with logged_process("devplug_nvidia", args, short_dir / "log", env=nvidia_env(NODE_NAME=NODE)):
            (published,) = await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=30)
            assert [d["name"] for d in published["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
            assert published["spec"]["pool"]["name"] == NODE
            await notify(kubelet / "plugins_registry" / f"{DRIVER}-reg.sock")
            api.add_claim("ns", "c", requests=[("gpu", ["gpu-6"])])
            uid = api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)["metadata"]["uid"]
            dra_socket = kubelet / "plugins" / DRIVER / "dra.sock"
            answer = (await prepare(dra_socket, ("ns", "c", uid)))[uid]
            assert answer.error == ""
            assert [list(d.cdi_device_ids) for d in answer.devices] == [
                [f"k8s.gpu.nvidia.com/claim={uid}-gpu-6"]
            ]
            spec = yaml.safe_load((cdi / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").read_text())
            assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
                {"path": "/dev/nvidia6", "hostPath": f"{root}/dev/nvidia6"}
            ]
            assert (await unprepare(dra_socket, ("ns", "c", uid)))[uid].error == ""
            assert list(cdi.iterdir()) == []
        # SIGTERM ended it with status 0 (logged_process checks); the sockets are gone.
        assert not (kubelet / "plugins_registry" / f"{DRIVER}-reg.sock").exists()


async def test_fake_nvml_lays_out_its_own_tree_for_mig_claims(short_dir: Path) -> None:
    kubelet = short_dir / "k"
    (kubelet / "plugins_registry").mkdir(parents=True)  # the kubelet's, made by its plugin watcher
    cdi = short_dir / "cdi"
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        args = [
            "--api", "dra", "--fake-nvml", "mig-uniform", "--node-name", NODE,
            "--kubeconfig", str(api.write_kubeconfig(short_dir / "kc")), "--kubelet-root", str(kubelet),
            "--cdi-dir", str(cdi),
        ]  # fmt: skip
        async with logged_process("devplug_nvidia", args, short_dir / "log", env=nvidia_env()):
            (published,) = await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=30)
            assert len(published["spec"]["devices"]) == 14
            api.add_claim("ns", "c", requests=[("mig", ["gpu-1-mig-1g5gb-0-6"])])
            uid = api.allocate_claim("ns", "c", node=NODE, driver=DRIVER)["metadata"]["uid"]
            dra_socket = kubelet / "plugins" / DRIVER / "dra.sock"
            assert (await prepare(dra_socket, ("ns", "c", uid)))[uid].error == ""
            spec = yaml.safe_load((cdi / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").read_text())
            nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
            assert [n["path"] for n in nodes] == [
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap255",  # gpu1/gi13/access
                "/dev/nvidia-caps/nvidia-cap256",  # gpu1/gi13/ci0/access
            ]


async def test_no_node_name_is_one_line_and_exit_2(short_dir: Path) -> None:
    root = write_root(MODELS["pcie-a10"], short_dir / "root")
    command = [
        sys.executable, "-m", "devplug_nvidia", "--api", "dra", "--fake-nvml", "pcie-a10",
        "--driver-root", str(root), "--kubelet-root", str(short_dir / "k"),
    ]  # fmt: skip
    process = await anyio.run_process(command, env=nvidia_env(), check=False)
    assert process.returncode == 2
    assert process.stderr.decode().strip().splitlines() == [
        "devplug-nvidia: no node name: pass --node-name or set NODE_NAME "
        "(spec.nodeName through the downward API)"
    ]


async def test_the_dra_conformance_checks_pass_on_a_mig_machine(short_dir: Path) -> None:
    root = write_root(MODELS["mig-mixed"], short_dir / "root")
    command = [
        sys.executable, "-m", "devplug_nvidia", "--api", "dra", "--fake-nvml", "mig-mixed",
        "--driver-root", str(root), "--node-name", "{node}", "--kubeconfig", "{kubeconfig}",
        "--kubelet-root", "{kubelet_root}", "--cdi-root", "{cdi_dir}",
    ]  # fmt: skip
    report = await run_dra_conformance(command, driver=DRIVER, env=nvidia_env(), timeout=30)
    assert report.passed, (report.failures, report.output_tail)


@pytest.mark.parametrize("model", ["dgx-a100", "mig-mixed"])
async def test_both_apis_from_one_process_pass_the_dra_checks(short_dir: Path, model: str) -> None:
    """--api device-plugin,dra: the device plugin's resources and gpu.nvidia.com, one ledger (the
    check both_apis: a GPU given through one API is withheld from the other within 1 s)."""
    root = write_root(MODELS[model], short_dir / "root")
    command = [
        sys.executable, "-m", "devplug_nvidia", "--api", "device-plugin,dra", "--fake-nvml", model,
        "--driver-root", str(root), "--node-name", "{node}", "--kubeconfig", "{kubeconfig}",
        "--kubelet-root", "{kubelet_root}", "--cdi-root", "{cdi_dir}", "--mig-strategy", "mixed",
    ]  # fmt: skip
    report = await run_dra_conformance(command, driver=DRIVER, env=nvidia_env(), timeout=30)
    assert report.passed, (report.failures, report.output_tail)
    assert report.result("both_apis").status == "pass", report.results
