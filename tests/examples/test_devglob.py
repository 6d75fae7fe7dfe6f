"""The devglob example against the fake kubelet, with a temporary directory standing in for /dev.

Real gRPC over unix sockets, real inotify: the way a plugin author would test a plugin with
devplug's testing kit (the ``fake_kubelet`` fixture comes with devplug's pytest plugin).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import pytest
from devglob import DevGlob, DevGlobSettings

import devplug
from devplug import ConfigError, ContainerAllocation, Device, DeviceSpec, Health, load_settings
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child

RESOURCE = "example.com/serial"
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "devglob" / "devglob.py"
OK, BAD = Health.HEALTHY, Health.UNHEALTHY


def make_node(path: Path) -> None:
    """Create a character device standing in for a real one (``/dev/null``'s numbers).

    mknod needs CAP_MKNOD (root, outside most containers); without it, a symlink to /dev/null
    is a character device as far as stat, and so the plugin, can tell.
    """
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        path.symlink_to("/dev/null")


def table(devices: tuple[Device, ...]) -> list[tuple[str, Health]]:
    return [(d.id, d.health) for d in devices]


def listed(*expected: tuple[str, Health]) -> Callable[[tuple[Device, ...]], bool]:
    return lambda devices: table(devices) == list(expected)


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    """An empty directory standing in for the host's /dev."""
    path = tmp_path / "dev"
    path.mkdir()
    return path


@asynccontextmanager
async def serving(plugin: DevGlob, kubelet: FakeKubelet) -> AsyncIterator[None]:
    """Serve ``plugin`` to ``kubelet`` in the background until the block ends (as on SIGTERM)."""
    async with devplug.testing.serving(plugin, kubelet):
        await kubelet.wait_for_registration(plugin.resource_name)
        yield


@pytest.mark.anyio
async def test_lists_matching_nodes_with_their_health(dev: Path, fake_kubelet: FakeKubelet) -> None:
    make_node(dev / "ttyUSB0")
    make_node(dev / "ttyUSB1")
    make_node(dev / "ttyS0")  # does not match the pattern
    (dev / "ttyUSB2").touch()  # matches, but is no device node
    (dev / "ttyUSB3").symlink_to(dev / "gone")  # matches, but leads nowhere
    async with serving(DevGlob(RESOURCE, "/dev/ttyUSB*", dev), fake_kubelet):
        devices = await fake_kubelet.wait_for_devices(RESOURCE)
        assert table(devices) == [("ttyUSB0", OK), ("ttyUSB1", OK), ("ttyUSB2", BAD), ("ttyUSB3", BAD)]
        assert fake_kubelet.capacity(RESOURCE) == 4
        assert fake_kubelet.allocatable(RESOURCE) == 2


@pytest.mark.anyio
async def test_nodes_come_and_go_live(dev: Path, fake_kubelet: FakeKubelet) -> None:
    async with serving(DevGlob(RESOURCE, "/dev/ttyUSB*", dev), fake_kubelet):
        await fake_kubelet.wait_for_devices(RESOURCE, listed())
        make_node(dev / "ttyUSB0")  # plugged in
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB0", OK)))
        make_node(dev / "incoming")
        (dev / "incoming").rename(dev / "ttyUSB1")  # renamed into place
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB0", OK), ("ttyUSB1", OK)))
        (dev / "ttyUSB0").unlink()  # unplugged
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB1", OK)))
        (dev / "ttyUSB1").unlink()
        (dev / "ttyUSB1").touch()  # something else took its name
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB1", BAD)))
        (dev / "ttyUSB1").unlink()
        make_node(dev / "ttyUSB1")
        make_node(dev / "ttyS0")
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB1", OK)))
        seen = {device_id for lst in fake_kubelet.resource(RESOURCE).raw_lists for device_id, _, _ in lst}
        assert seen == {"ttyUSB0", "ttyUSB1"}


@pytest.mark.anyio
async def test_allocate_gives_the_host_nodes(dev: Path, fake_kubelet: FakeKubelet) -> None:
    make_node(dev / "ttyUSB0")
    make_node(dev / "ttyUSB1")
    async with serving(DevGlob(RESOURCE, "/dev/ttyUSB*", dev), fake_kubelet):
        await fake_kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 2)
        allocation = await fake_kubelet.allocate(RESOURCE, ["ttyUSB1", "ttyUSB0"])
        # Host paths, not the stand-in directory: the container runtime resolves them on the host.
        assert allocation == ContainerAllocation(
            envs={"DEVGLOB_DEVICES": "/dev/ttyUSB1,/dev/ttyUSB0"},
            devices=(DeviceSpec.rw("/dev/ttyUSB1"), DeviceSpec.rw("/dev/ttyUSB0")),
        )


@pytest.mark.anyio
@pytest.mark.parametrize("pattern", ["/dev/kvm", "/dev/net/tun"])
async def test_single_node(dev: Path, fake_kubelet: FakeKubelet, pattern: str) -> None:
    resource = "example.com/" + pattern.rsplit("/", 1)[1]
    node = dev / pattern.removeprefix("/dev/")
    node.parent.mkdir(exist_ok=True)
    async with serving(DevGlob(resource, pattern, dev), fake_kubelet):
        await fake_kubelet.wait_for_devices(resource, listed())
        make_node(node)
        devices = await fake_kubelet.wait_for_devices(resource, lambda ds: len(ds) == 1)
        assert table(devices) == [(node.name, OK)]
        assert (await fake_kubelet.allocate(resource, [node.name])).devices == (DeviceSpec.rw(pattern),)
        if node.parent != dev:
            # The watched directory itself goes and comes back: devplug restarts the watch.
            shutil.rmtree(node.parent)
            await fake_kubelet.wait_for_devices(resource, listed())
            node.parent.mkdir()
            make_node(node)
            await fake_kubelet.wait_for_devices(resource, listed((node.name, OK)))


@pytest.mark.anyio
async def test_kubelet_restart_re_registers(dev: Path, fake_kubelet: FakeKubelet) -> None:
    make_node(dev / "ttyUSB0")
    async with serving(DevGlob(RESOURCE, "/dev/ttyUSB*", dev), fake_kubelet):
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB0", OK)))
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(fake_kubelet.restart, downtime=0.3))
            await anyio.sleep(0.1)
            make_node(dev / "ttyUSB1")  # plugged in while the kubelet is down
        await fake_kubelet.wait_for_registration(RESOURCE, count=2)
        await fake_kubelet.wait_for_devices(RESOURCE, listed(("ttyUSB0", OK), ("ttyUSB1", OK)))
        allocation = await fake_kubelet.allocate(RESOURCE, ["ttyUSB1"])
        assert allocation.envs == {"DEVGLOB_DEVICES": "/dev/ttyUSB1"}


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["script", "devplug run"])
async def test_runs_as_a_process(dev: Path, fake_kubelet: FakeKubelet, how: str) -> None:
    make_node(dev / "ttyACM0")
    if how == "script":
        command = [sys.executable, str(SCRIPT)]
    else:  # the class's own settings through `devplug run MODULE:CLASS`
        command = [sys.executable, "-m", "devplug", "run", "devglob:DevGlob"]
    command += ["--device-plugin-dir", str(fake_kubelet.device_plugin_dir)]
    command += ["--dev-root", str(dev), "--pattern", "/dev/ttyACM*", "--resource", "example.com/acm"]
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parent)}
    async with await anyio.open_process(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    ) as process:
        registration = await fake_kubelet.wait_for_registration("example.com/acm", timeout=15)
        await fake_kubelet.wait_for_devices("example.com/acm", listed(("ttyACM0", OK)))
        signal_child(process, signal.SIGTERM)
        with anyio.fail_after(5):
            assert await process.wait() == 0
    assert not (fake_kubelet.device_plugin_dir / registration.endpoint).exists()


@pytest.mark.parametrize("pattern", ["ttyUSB*", "/dev", "/tmp/ttyUSB*", "/dev/*/ttyUSB0", "/dev/../etc/x"])
def test_bad_pattern_is_a_config_error(pattern: str) -> None:
    with pytest.raises(ConfigError, match="invalid setting --pattern"):
        load_settings(DevGlobSettings, ["--pattern", pattern])


def test_settings_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVPLUG_RESOURCE", "example.com/kvm")
    settings = load_settings(DevGlobSettings, ["--pattern", "/dev/kvm", "--dev-root", "/host/dev"])
    plugin = DevGlob(settings.resource, settings.pattern, settings.dev_root)
    assert plugin.resource_name == "example.com/kvm"
    assert (str(plugin.host_dir), plugin.glob, plugin.local_dir) == ("/dev", "kvm", Path("/host/dev"))
