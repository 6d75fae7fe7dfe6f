"""Hooks that cannot work as written are refused at start, with one line (status 2 from the
commands), under either API; what may work is served."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from devplug import ConfigError, ContainerAllocation, Device, DevicePlugin, Runner
from devplug._hooks import hook_problem
from devplug.cdi import CdiSpec
from devplug.dra import Claim, DraDriver
from devplug.testing import FakeKubelet
from tests.support import ROOT, Widgets, serving, settings_for

pytestmark = pytest.mark.anyio


class SyncAllocate(Widgets):
    def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:  # type: ignore[override]
        return ContainerAllocation()


class SyncWatch(Widgets):
    def watch_devices(self) -> Iterator[Sequence[Device]]:  # type: ignore[override]
        yield [Device(id="w0")]


class AwaitedWatch(Widgets):
    async def watch_devices(self) -> Sequence[Device]:  # type: ignore[override]
        return [Device(id="w0")]


class GeneratorAllocate(Widgets):
    async def allocate(self, devices: Sequence[Device]) -> AsyncIterator[ContainerAllocation]:  # type: ignore[override]
        yield ContainerAllocation()


class SyncPreStart(Widgets):
    def pre_start_container(self, devices: Sequence[Device]) -> None:  # type: ignore[override]
        return None


class AsyncSpec(Widgets):
    async def cdi_spec(self, devices: Sequence[Device]) -> CdiSpec | None:  # type: ignore[override]
        return None


class SyncPrepare(Widgets):
    def prepare_claim(self, claim: Claim, devices: Any, config: Any) -> None:  # type: ignore[override]
        return None


class SyncUnprepare(Widgets):
    def unprepare_claim(self, claim: Claim) -> None:  # type: ignore[override]
        return None


SYNC = "must be an 'async def': devplug awaits it"
BOTH = [
    (SyncAllocate, f"allocate {SYNC}"),
    (SyncWatch, "watch_devices is a plain generator: write it as 'async def' with 'yield'"),
    (AwaitedWatch, "watch_devices is an 'async def' that does not yield: it must yield the device sets"),
    (GeneratorAllocate, "allocate is a generator: write it as 'async def' that returns its answer"),
]
DEVICE_PLUGIN = [
    *BOTH,
    (SyncPreStart, f"pre_start_container {SYNC}"),
    (AsyncSpec, "cdi_spec must be a plain 'def': devplug calls it without awaiting"),
]
DRA = [*BOTH, (SyncPrepare, f"prepare_claim {SYNC}"), (SyncUnprepare, f"unprepare_claim {SYNC}")]


@pytest.mark.parametrize(("cls", "problem"), DEVICE_PLUGIN, ids=[c.__name__ for c, _ in DEVICE_PLUGIN])
async def test_the_runner_refuses_a_hook_that_cannot_work(
    short_dir: Path, cls: type[DevicePlugin], problem: str
) -> None:
    with pytest.raises(ConfigError) as refused, anyio.fail_after(10):
        await Runner(cls(), settings_for(short_dir)).run(handle_signals=False)
    assert str(refused.value) == f"plugin {cls.__name__}: {problem}"


@pytest.mark.parametrize(("cls", "problem"), DRA, ids=[c.__name__ for c, _ in DRA])
def test_a_dra_driver_refuses_a_hook_that_cannot_work(
    short_dir: Path, cls: type[DevicePlugin], problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        DraDriver([cls()], settings_for(short_dir, node_name="n1"))
    assert str(refused.value) == f"plugin {cls.__name__}: {problem}"


def test_hooks_of_the_other_api_are_not_judged() -> None:
    assert hook_problem(SyncPrepare, "device-plugin") is None  # never called by a device plugin
    assert hook_problem(SyncPreStart, "dra") is None
    assert hook_problem(AsyncSpec, "dra") is None


class HandedOn(Widgets):
    """A plain ``def`` that hands on a coroutine, and a ``watch_devices`` returning an iterator."""

    def allocate(self, devices: Sequence[Device]) -> Awaitable[ContainerAllocation]:  # type: ignore[override]
        return super().allocate(devices)

    def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        return super().watch_devices()


async def test_hooks_that_may_work_are_served(fake_kubelet: FakeKubelet, short_dir: Path) -> None:
    assert hook_problem(HandedOn, "device-plugin") is None
    assert hook_problem(HandedOn, "dra") is None
    settings = settings_for(short_dir, device_plugin_dir=fake_kubelet.device_plugin_dir)
    async with serving(HandedOn(), settings):
        await fake_kubelet.wait_for_devices("example.com/widget")
        assert await fake_kubelet.allocate("example.com/widget", ["w0"])


@pytest.mark.parametrize("api", ["device-plugin", "dra"])
def test_devplug_run_refuses_a_sync_allocate_in_one_line(short_dir: Path, api: str) -> None:
    (short_dir / "syncalloc.py").write_text("from tests.unit.test_hook_refusals import SyncAllocate as Gpu\n")
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "run", "syncalloc:Gpu", "--api", api, "--node-name", "n1",
         "--kubelet-root", str(short_dir / "k"), "--kubeconfig", str(short_dir / "none")],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{short_dir}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"devplug run syncalloc:Gpu: plugin SyncAllocate: allocate {SYNC}"]
