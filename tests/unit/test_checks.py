"""Host-path checks: the function, and the Allocate path that applies it (warn / refuse / off)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devplug import ContainerAllocation, Device, DeviceSpec, KubeletError, Mount
from devplug.checks import HostPathError, check_host_paths, host_path_problems
from devplug.testing import FakeKubelet
from tests.support import Widgets, serving, settings_for


def allocation(*, devices: Sequence[str] = (), mounts: Sequence[str] = ()) -> ContainerAllocation:
    return ContainerAllocation(
        devices=tuple(DeviceSpec.rw(p, f"/dev/c{n}") for n, p in enumerate(devices)),
        mounts=tuple(Mount(host_path=p, container_path=f"/m{n}") for n, p in enumerate(mounts)),
    )


def test_problems(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    found = host_path_problems(
        allocation(
            devices=["/dev/null", "/dev/nope", str(tmp_path / "lib"), "dev/null"],
            mounts=[str(tmp_path / "lib"), "/nope"],
        )
    )
    assert [(p.kind, p.host_path, p.reason) for p in found] == [
        ("device", "/dev/nope", "missing"),
        ("device", str(tmp_path / "lib"), "not a device node"),
        ("device", "dev/null", "not absolute"),
        ("mount", "/nope", "missing"),
    ]
    assert str(found[0]) == "device host path /dev/nope (for /dev/c1): missing"


def test_paths_are_checked_under_the_host_root(tmp_path: Path) -> None:
    (tmp_path / "opt").mkdir()
    assert host_path_problems(allocation(mounts=["/opt"]), root=tmp_path) == []
    assert [p.reason for p in host_path_problems(allocation(mounts=["/srv"]), root=tmp_path)] == ["missing"]


def test_modes() -> None:
    bad = allocation(devices=["/dev/nope"])
    assert check_host_paths(bad, mode="off") == []
    with capture_logs() as logs:
        assert len(check_host_paths(bad, mode="warn")) == 1
    assert logs[0]["event"] == "host_path_invalid" and logs[0]["host_path"] == "/dev/nope"
    with pytest.raises(HostPathError, match="device host path /dev/nope") as info:
        check_host_paths(bad, mode="refuse")
    assert [p.host_path for p in info.value.problems] == ["/dev/nope"]
    assert check_host_paths(allocation(devices=["/dev/null"]), mode="refuse") == []


class MissingWidgets(Widgets):
    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return allocation(devices=["/dev/null", "/dev/widget-gone"])


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["warn", "refuse", "off"])
async def test_allocate_path(short_dir: Path, mode: str) -> None:
    settings = settings_for(short_dir, host_path_check=mode)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(MissingWidgets(), settings):
        await kubelet.wait_for_devices("example.com/widget")
        with capture_logs() as logs:
            if mode == "refuse":
                with pytest.raises(KubeletError) as info:
                    await kubelet.allocate("example.com/widget", ["w1"])
                assert info.value.code == "FAILED_PRECONDITION"
                assert "/dev/widget-gone" in str(info.value) and "missing" in str(info.value)
            else:
                got = await kubelet.allocate("example.com/widget", ["w1"])
                assert [d.host_path for d in got.devices] == ["/dev/null", "/dev/widget-gone"]
    events = [e["event"] for e in logs]
    expected = {"warn": ["host_path_invalid"], "refuse": ["allocate_refused"], "off": []}[mode]
    assert [e for e in events if e in ("host_path_invalid", "allocate_refused")] == expected
