"""devplug-nvidia as a real process on the fake NVML's machine models, against a FakeKubelet."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.support import logged_process, never_within

pytestmark = pytest.mark.anyio
_NVIDIA_ENV = ("MIG_STRATEGY", "CONFIG_FILE", "FAIL_ON_INIT_ERROR", "NVIDIA_DRIVER_ROOT", "DEVPLUG_FAKE_NVML")


def _env(tmp: Path | None = None) -> dict[str, str]:
    """The environment without NVIDIA's variables; ``tmp``: the process's TMPDIR."""
    env = {k: v for k, v in os.environ.items() if k not in _NVIDIA_ENV}
    return env if tmp is None else env | {"TMPDIR": str(tmp)}


def _tmp(short_dir: Path) -> Path:
    """An empty TMPDIR for one process, to see what it leaves behind."""
    tmp = short_dir / "tmp"
    tmp.mkdir()
    return tmp


def _events(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _warnings(log: Path) -> list[dict[str, object]]:
    return [e for e in _events(log) if e["level"] in ("warning", "error", "critical")]


def _fake_tree(log: Path) -> Path:
    """The temporary tree the process said it laid out."""
    (event,) = [e for e in _events(log) if e["event"] == "fake_nvml_root"]
    return Path(str(event["path"]))


@asynccontextmanager
async def devplug_nvidia(log: Path, *args: str, tmp: Path | None = None) -> AsyncIterator[Process]:
    """devplug-nvidia with ``args``; SIGTERM at the end, which must end it with status 0."""
    async with logged_process("devplug_nvidia", args, log, env=_env(tmp)) as process:
        yield process


async def test_dgx_a100_serves_eight_gpus(short_dir: Path) -> None:
    # No tree written beforehand: --fake-nvml lays the model's out itself, and removes it.
    dp, log, tmp = short_dir / "dp", short_dir / "log", _tmp(short_dir)
    args = ("--fake-nvml", "dgx-a100", "--device-plugin-dir", str(dp))
    async with FakeKubelet(dp) as kubelet, devplug_nvidia(log, *args, "--pass-device-specs", tmp=tmp):
        reg = await kubelet.wait_for_registration("nvidia.com/gpu", timeout=20)
        assert reg.endpoint.startswith("nvidia.com-gpu-")
        devices = await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 8)
        assert all(d.id.startswith("GPU-") and d.healthy for d in devices)
        assert [d.numa_nodes for d in devices] == [(3,), (3,), (1,), (1,), (7,), (7,), (5,), (5,)]
        allocation = await kubelet.allocate("nvidia.com/gpu", [devices[2].id, devices[0].id])
        assert allocation.envs["NVIDIA_VISIBLE_DEVICES"] == f"{devices[2].id},{devices[0].id}"
        gpu_nodes = [
            s.container_path for s in allocation.devices if s.container_path.startswith("/dev/nvidia")
        ]
        assert "/dev/nvidia2" in gpu_nodes and "/dev/nvidia0" in gpu_nodes
        root = _fake_tree(log)
        assert root.is_relative_to(tmp) and (root / "dev" / "nvidia2").exists()
        assert all(s.host_path.startswith(f"{root}/") for s in allocation.devices)
        # Preferred allocation through the link matrix read at start-up: every pair has 12
        # NVLinks through the NVSwitches, so the PCIe switch a pair shares decides (0-1, 2-3, ...).
        ids = [d.id for d in devices]
        assert (await kubelet.get_options("nvidia.com/gpu")).get_preferred_allocation_available
        chosen = await kubelet.preferred_allocation("nvidia.com/gpu", ids, [ids[2]], 2)
        assert chosen == [ids[2], ids[3]]
        chosen = await kubelet.preferred_allocation("nvidia.com/gpu", ids[1:], [], 2)
        assert set(chosen) in ({ids[2], ids[3]}, {ids[4], ids[5]}, {ids[6], ids[7]})
    assert _warnings(log) == []
    assert list(tmp.iterdir()) == []  # the tree went with the SIGTERM


async def test_sigint_removes_the_tree_too(short_dir: Path) -> None:
    dp, log, tmp = short_dir / "dp", short_dir / "log", _tmp(short_dir)
    args = ("--fake-nvml", "pcie-a10", "--device-plugin-dir", str(dp))
    async with FakeKubelet(dp) as kubelet, devplug_nvidia(log, *args, tmp=tmp) as process:
        devices = await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 4, timeout=20)
        assert [d.numa_nodes for d in devices] == [(0,), (0,), (1,), (1,)]
        assert _fake_tree(log).is_dir()
        signal_child(process, signal.SIGINT)
        with anyio.fail_after(10):
            assert await process.wait() == 0
    assert list(tmp.iterdir()) == []
    assert _warnings(log) == []


async def test_mig_mixed_serves_one_resource_per_profile(short_dir: Path) -> None:
    dp, log, tmp = short_dir / "dp", short_dir / "log", _tmp(short_dir)
    args = ("--fake-nvml", "mig-mixed", "--device-plugin-dir", str(dp))
    async with (
        FakeKubelet(dp) as kubelet,
        devplug_nvidia(log, *args, "--mig-strategy", "mixed", "--pass-device-specs", tmp=tmp),
    ):
        mig = await kubelet.wait_for_devices("nvidia.com/mig-1g.5gb", lambda ds: len(ds) >= 7, timeout=20)
        assert all(d.id.startswith("MIG-") for d in mig)
        assert [d.numa_nodes for d in mig] == [(3,)] * 7
        # The MIG capability nodes come from the tree's /proc/driver/nvidia-caps/mig-minors.
        allocation = await kubelet.allocate("nvidia.com/mig-1g.5gb", [mig[0].id])
        caps = [s.container_path for s in allocation.devices if "nvidia-caps" in s.container_path]
        assert len(caps) == 2, allocation.devices
        for resource in ("nvidia.com/gpu", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb.me"):
            await kubelet.wait_for_registration(resource, timeout=20)
        # GPU 3 of the model has MIG on and no instances: the one warning, and a true one.
        assert [e["event"] for e in _warnings(log)] == ["mig_enabled_without_devices"]
        await kubelet.restart()
        await kubelet.wait_for_registration("nvidia.com/mig-1g.5gb", count=2)
    assert list(tmp.iterdir()) == []


async def test_labels_subcommand(short_dir: Path) -> None:
    out, tmp = short_dir / "features.d" / "gfd", _tmp(short_dir)
    result = await anyio.run_process(
        [sys.executable, "-m", "devplug_nvidia", "labels", "--oneshot", "--no-timestamp",
         "--fake-nvml", "dgx-h100", "--output-file", str(out)],
        check=False,
        env=_env(tmp),
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    labels = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    # The PCI class and the DMI product name come from the model's tree, not this machine.
    assert labels["nvidia.com/gpu.mode"] == "compute"
    assert labels["nvidia.com/gpu.machine"] == "dgx-h100"
    assert '"level": "warning"' not in err, err
    assert list(tmp.iterdir()) == []


async def test_single_strategy_error_exits_2(short_dir: Path) -> None:
    tmp = _tmp(short_dir)
    result = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "devplug_nvidia",
            "--fake-nvml",
            "mig-mixed",
            "--mig-strategy",
            "single",
            "--device-plugin-dir",
            str(short_dir / "dp"),
        ],
        check=False,
        env=_env(tmp),
    )
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1 and "single" in err, err
    assert list(tmp.iterdir()) == []  # a start-up error removes the tree as well


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a real NVIDIA driver is present here")
async def test_no_driver_fails_or_idles(short_dir: Path) -> None:
    # Real nvidia-ml-py, no driver on this machine: NVML cannot load its library.
    dp = short_dir / "dp"
    result = await anyio.run_process(
        [sys.executable, "-m", "devplug_nvidia", "--device-plugin-dir", str(dp)], check=False, env=_env()
    )
    assert result.returncode == 1
    err = result.stderr.decode()
    assert "libnvidia-ml.so.1" in err and "Traceback" not in err, err
    # fail-on-init-error=false: stays up, advertises nothing, says why once.
    log = short_dir / "idle.log"
    async with (
        FakeKubelet(dp) as kubelet,
        devplug_nvidia(log, "--fail-on-init-error=false", "--device-plugin-dir", str(dp)),
    ):
        await never_within(lambda: kubelet.registrations, 1.0, what="a registration")
    assert log.read_text().count("init_failed_idle") == 1
