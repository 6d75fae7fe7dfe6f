"""MPS: the checks made on the control daemon, and how a resource behaves while it is missing."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import Device, Health
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._cli._main import build_plugins
from devplug_nvidia._config._file import Sharing
from devplug_nvidia._device_plugin._sharing import apply_sharing
from devplug_nvidia._gpu._mps import MpsDaemon, MpsDaemonError, mps_view
from devplug_nvidia.plugin import NvidiaPlugin
from devplug_nvidia.testing import fake_nvml
from tests.nvidia.nvidia_health_kit import discovered

SHARED = "nvidia.com/gpu.shared"


def ready(root: Path, resource: str = SHARED) -> None:
    """What NVIDIA's MPS control daemon leaves under its root once it is ready."""
    (root / resource / "pipe").mkdir(parents=True, exist_ok=True)
    (root / resource / "log").mkdir(exist_ok=True)
    (root / "shm").mkdir(exist_ok=True)
    (root / resource / ".started").touch()


@pytest.mark.parametrize(
    ("undo", "message"),
    [
        (shutil.rmtree, "MPS root {root} does not exist: deploy NVIDIA's MPS control daemon"),
        (lambda r: shutil.rmtree(r / SHARED), "no MPS control daemon for nvidia.com/gpu.shared"),
        (
            lambda r: (r / SHARED / ".started").unlink(),
            "has not signalled readiness ({root}/nvidia.com/gpu.shared/.started",
        ),
        (
            lambda r: (r / SHARED / "pipe").rmdir(),
            "pipe directory {root}/nvidia.com/gpu.shared/pipe is missing",
        ),
        (lambda r: (r / "shm").rmdir(), "shm directory {root}/shm is missing"),
    ],
)
def test_checks_say_what_is_missing(tmp_path: Path, undo: Callable[[Path], None], message: str) -> None:
    root = tmp_path / "mps"
    ready(root)
    daemon = MpsDaemon(SHARED, root, "/run/nvidia/mps")
    daemon.check()
    undo(root)
    with pytest.raises(MpsDaemonError) as info:
        daemon.check()
    assert message.format(root=root) in str(info.value)
    if "deploy" in message:
        assert "--mps-root (/run/nvidia/mps)" in str(info.value) and "/mps" in str(info.value)


def _control(tmp_path: Path, exit_code: int) -> Path:
    script = tmp_path / "nvidia-cuda-mps-control"
    script.write_text(
        "#!/bin/sh\n"
        f'cat > "{tmp_path}/asked"\n'
        f'echo "$CUDA_MPS_PIPE_DIRECTORY" > "{tmp_path}/pipe"\n'
        f"[ {exit_code} -eq 0 ] && echo 100 || echo 'Cannot find MPS control daemon process' >&2\n"
        f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_the_daemon_is_asked_whether_it_answers(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    ready(root)
    MpsDaemon(SHARED, root, "/x", control=str(_control(tmp_path, 0))).check()
    assert (tmp_path / "asked").read_text() == "get_default_active_thread_percentage"
    assert (tmp_path / "pipe").read_text().strip() == str(root / SHARED / "pipe")
    with pytest.raises(MpsDaemonError, match="does not answer") as info:
        MpsDaemon(SHARED, root, "/x", control=str(_control(tmp_path, 1))).check()
    assert "Cannot find MPS control daemon process" in str(info.value)


def test_mps_view(tmp_path: Path) -> None:
    if Path("/mps").is_dir():
        pytest.skip("/mps exists on this machine")
    assert mps_view("/run/nvidia/mps", tmp_path) == tmp_path / "run/nvidia/mps"
    assert mps_view("/run/nvidia/mps") == Path("/run/nvidia/mps")


def mps_plugin(tmp_path: Path, root: Path) -> NvidiaPlugin:
    settings = NvidiaSettings(
        mps_root=str(root),
        sharing=Sharing.model_validate(
            {"mps": {"renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}
        ),
    )
    resources = apply_sharing(discovered(fake_nvml("pcie-a10"), tmp_path / "machine"), settings.sharing)
    (plugin,) = build_plugins(resources, settings, present=frozenset(), imex=())
    return plugin


@pytest.mark.anyio
async def test_resource_unhealthy_until_the_daemon_is_ready(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    plugin = mps_plugin(tmp_path, root)
    assert plugin.resource_name == SHARED
    assert plugin.mps is not None and plugin.mps.root == root
    plugin.mps_check_interval = 0.05
    watch = plugin.watch_devices()
    with capture_logs() as logs:
        first = await anext(watch)
    assert len(first) == 8 and all(d.health is Health.UNHEALTHY for d in first)
    (warning,) = [e for e in logs if e["event"] == "mps_daemon_not_ready"]
    assert "does not exist" in warning["reason"]
    device = Device(id=first[0].id)
    with pytest.raises(MpsDaemonError, match=r"MPS root .* does not exist"):
        await plugin.allocate([device])
    ready(root)
    with anyio.fail_after(3):
        second = await anext(watch)
    assert all(d.health is Health.HEALTHY for d in second)
    got = await plugin.allocate([device])
    pipe = f"/mps/{SHARED}/pipe"
    assert got.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert {(m.container_path, m.host_path) for m in got.mounts} == {
        (pipe, f"{root}/{SHARED}/pipe"),
        ("/dev/shm", f"{root}/shm"),
    }
    # The daemon goes away: the devices follow.
    (root / SHARED / ".started").unlink()
    with anyio.fail_after(3):
        third = await anext(watch)
    assert all(d.health is Health.UNHEALTHY for d in third)
    await watch.aclose()


@pytest.mark.anyio
async def test_mps_replicas_reject_requests_above_one(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    ready(root)
    plugin = mps_plugin(tmp_path, root)
    ids = [d.id for d in plugin.devices()[:2]]
    with pytest.raises(
        ValueError, match=r"^invalid request: maximum request size for shared resources is 1; found 2$"
    ):
        await plugin.allocate([Device(id=i) for i in ids])


def test_time_slicing_has_no_daemon(tmp_path: Path) -> None:
    settings = NvidiaSettings(
        sharing=Sharing.model_validate(
            {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}
        )
    )
    resources = apply_sharing(discovered(fake_nvml("pcie-a10"), tmp_path), settings.sharing)
    (plugin,) = build_plugins(resources, settings, present=frozenset(), imex=())
    assert plugin.mps is None
