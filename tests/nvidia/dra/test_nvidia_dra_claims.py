"""devplug-nvidia as a DRA driver: claims prepared and unprepared through FakeKubelet's DRA mode,
with the transient CDI spec NVIDIA writes per claim (nvidia-dra.md §6)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplug.errors import KubeletError
from devplug.testing import FakeKubeAPI, FakeKubelet, serving_dra
from devplug_nvidia.config import NvidiaSettings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, mig_cap_minor, write_root
from tests.nvidia.nvidia_dra_kit import dra_cluster

pytestmark = pytest.mark.anyio

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
CDI_KIND = "k8s.gpu.nvidia.com/claim"


@dataclass
class Node:
    api: FakeKubeAPI
    kubelet: FakeKubelet
    plugin: NvidiaDraPlugin
    root: Path
    """The fake machine's root (driver root and dev root)."""
    cdi: Path

    def claim(self, name: str, devices: list[str]) -> str:
        """A claim for ``devices`` (by name), allocated on the node; its UID."""
        self.api.add_claim("ns", name, requests=[("gpu", devices)])
        return str(self.api.allocate_claim("ns", name, node=NODE, driver=DRIVER)["metadata"]["uid"])

    def spec_file(self, uid: str) -> Path:
        return self.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"

    def spec(self, uid: str) -> dict[str, Any]:
        text = self.spec_file(uid).read_text()
        assert text.startswith("---\n")
        doc: dict[str, Any] = yaml.safe_load(text)
        return doc


@asynccontextmanager
async def node(model: str, short_dir: Path) -> AsyncIterator[Node]:
    root = write_root(MODELS[model], short_dir / "root")
    settings = NvidiaSettings(driver_root=str(root), driver_name=DRIVER)
    plugin = NvidiaDraPlugin.discover(
        settings, module=FakeNvml(MODELS[model]), sysfs=root / "sys", proc=root / "proc"
    )
    async with (
        dra_cluster(short_dir) as (api, kubelet, kubelet_root),
        serving_dra(plugin, api, kubelet_root, node_name=NODE),
    ):
        await kubelet.wait_for_usable(DRIVER, timeout=10)
        await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)
        yield Node(api, kubelet, plugin, root, kubelet_root / "cdi")


def _node(path: str, root: Path) -> dict[str, str]:
    return {"path": path, "hostPath": f"{root}{path}"}


def _cap(minor: int) -> dict[str, Any]:
    return {
        "path": f"/dev/nvidia-caps/nvidia-cap{minor}",
        "type": "c",
        "major": 235,
        "minor": minor,
        "fileMode": 0o444,
    }


def _check_common_edits(spec: dict[str, Any], root: Path) -> None:
    edits = spec["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert edits["deviceNodes"] == [
        _node(p, root)
        for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
    ]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    assert mounts[lib] == {
        "hostPath": f"{root}{lib}",
        "containerPath": lib,
        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
    }
    assert "/usr/bin/nvidia-smi" in mounts
    assert [h["args"][2] for h in edits["hooks"]] == ["create-symlinks", "update-ldcache"]
    assert all(h["hookName"] == "createContainer" for h in edits["hooks"])


async def test_a_gpu_claim_is_prepared_and_unprepared_as_nvidia_does(short_dir: Path) -> None:
    async with node("dgx-a100", short_dir) as n:
        uid = n.claim("two-gpus", ["gpu-3", "gpu-5"])
        ref = ("ns", "two-gpus", uid)
        results = await n.kubelet.prepare(DRIVER, [ref])
        devices = results[uid].devices
        assert [(d.device, d.pool, d.request_names, d.cdi_device_ids) for d in devices] == [
            ("gpu-3", NODE, ("gpu",), (f"{CDI_KIND}={uid}-gpu-3",)),
            ("gpu-5", NODE, ("gpu",), (f"{CDI_KIND}={uid}-gpu-5",)),
        ]
        spec = n.spec(uid)
        assert list(spec) == ["cdiVersion", "kind", "devices", "containerEdits"]
        assert (spec["cdiVersion"], spec["kind"]) == ("0.5.0", CDI_KIND)
        assert spec["devices"] == [
            {"name": f"{uid}-gpu-3", "containerEdits": {"deviceNodes": [_node("/dev/nvidia3", n.root)]}},
            {"name": f"{uid}-gpu-5", "containerEdits": {"deviceNodes": [_node("/dev/nvidia5", n.root)]}},
        ]
        _check_common_edits(spec, n.root)
        assert oct(n.spec_file(uid).stat().st_mode & 0o777) == "0o644"
        await n.kubelet.unprepare(DRIVER, [ref])
        assert not n.spec_file(uid).exists()
        assert list(n.cdi.iterdir()) == []


async def test_a_mig_claim_gets_its_capability_nodes(short_dir: Path) -> None:
    async with node("mig-mixed", short_dir) as n:
        uid = n.claim("mig", ["gpu-1-mig-2g10gb-1-4", "gpu-4"])
        ref = ("ns", "mig", uid)
        results = await n.kubelet.prepare(DRIVER, [ref])
        assert [d.cdi_device_ids for d in results[uid].devices] == [
            (f"{CDI_KIND}={uid}-gpu-1-mig-2g10gb-1-4",),
            (f"{CDI_KIND}={uid}-gpu-4",),
        ]
        spec = n.spec(uid)
        # The 2g.10gb instance at placement 4 of GPU 1 is GPU instance 5 with compute instance 0:
        # the minors the driver lists for gpu1/gi5/access and gpu1/gi5/ci0/access.
        gi, ci = mig_cap_minor(1, 5), mig_cap_minor(1, 5, 0)
        assert (gi, ci) == (183, 184)
        assert spec["devices"] == [
            {
                "name": f"{uid}-gpu-1-mig-2g10gb-1-4",
                "containerEdits": {"deviceNodes": [_node("/dev/nvidia1", n.root), _cap(gi), _cap(ci)]},
            },
            {"name": f"{uid}-gpu-4", "containerEdits": {"deviceNodes": [_node("/dev/nvidia4", n.root)]}},
        ]
        _check_common_edits(spec, n.root)
        await n.kubelet.unprepare(DRIVER, [ref])
        assert not n.spec_file(uid).exists()


async def test_a_repeated_prepare_answers_the_same_and_restores_a_deleted_spec(short_dir: Path) -> None:
    async with node("mig-uniform", short_dir) as n:
        calls: list[str] = []
        original: Callable[..., Any] = n.plugin.claim_spec

        def counted(claim_uid: str, devices: Any) -> Any:
            calls.append(claim_uid)
            return original(claim_uid, devices)

        n.plugin.claim_spec = counted  # type: ignore[method-assign]
        uid = n.claim("c", ["gpu-1-mig-1g5gb-0-3"])
        ref = ("ns", "c", uid)
        first = await n.kubelet.prepare(DRIVER, [ref])
        text = n.spec_file(uid).read_text()
        again = await n.kubelet.prepare(DRIVER, [ref])
        assert again == first
        n.spec_file(uid).unlink()  # a reboot empties /var/run/cdi
        restored = await n.kubelet.prepare(DRIVER, [ref])
        assert restored == first
        assert n.spec_file(uid).read_text() == text
        assert calls == [uid]  # the checkpoint answered the repeats
        await n.kubelet.unprepare(DRIVER, [ref])
        await n.kubelet.unprepare(DRIVER, [ref])  # unknown by now: a no-op
        assert not n.spec_file(uid).exists()


async def test_a_missing_capability_file_fails_the_claim_and_leaves_nothing(short_dir: Path) -> None:
    async with node("mig-uniform", short_dir) as n:
        uid = n.claim("c", ["gpu-0-mig-1g5gb-0-2"])
        # GPU instance 9 (placement 2) of GPU 0 is gone from the driver's capabilities.
        access = n.root / "proc/driver/nvidia/capabilities/gpu0/mig/gi9/access"
        access.unlink()
        with pytest.raises(KubeletError, match=r"failed to parse capabilities file .*gpu0/mig/gi9/access"):
            await n.kubelet.prepare(DRIVER, [("ns", "c", uid)])
        assert not n.spec_file(uid).exists()
        access.write_text("DeviceFileMinor: 84\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        results = await n.kubelet.prepare(DRIVER, [("ns", "c", uid)])
        assert results[uid].error == ""
        assert n.spec(uid)["devices"][0]["containerEdits"]["deviceNodes"][1] == _cap(84)
