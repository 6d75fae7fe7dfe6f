"""devplug-fake as a real process against a FakeKubelet in the test process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from devplug.testing import FakeKubelet
from tests.support import logged_process

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "example.com/fake"


@asynccontextmanager
async def devplug_fake(dp_dir: Path, *args: str) -> AsyncIterator[Process]:
    """devplug-fake serving ``dp_dir``; SIGTERM on exit, which must end it with status 0."""
    async with logged_process("devplug_fake", ["--device-plugin-dir", str(dp_dir), *args]) as process:
        yield process


def write_state(path: Path, devices: list[dict[str, object]], *, atomic: bool = True) -> None:
    text = json.dumps({"devices": devices})
    if atomic:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        path.write_text(text)  # in place: truncate and write


def ids_health(devices: tuple[object, ...]) -> list[tuple[str, str]]:
    return [(d.id, d.health.value) for d in devices]  # type: ignore[attr-defined]


async def test_registers_and_serves(short_dir: Path) -> None:
    dp = short_dir / "dp"
    async with FakeKubelet(dp) as kubelet:
        cdi = ("--cdi", "--cdi-dir", str(short_dir / "cdi"))
        args = ("--count", "3", "--numa-nodes", "2", "--device-specs", *cdi)
        async with devplug_fake(dp, *args):
            reg = await kubelet.wait_for_registration(RESOURCE, timeout=15)
            assert re.fullmatch(r"example\.com-fake-[0-9a-f]{8}\.sock", reg.endpoint)
            devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 3)
            assert [(d.id, d.numa_nodes) for d in devices] == [
                ("fake-0", (0,)),
                ("fake-1", (1,)),
                ("fake-2", (0,)),
            ]
            allocation = await kubelet.allocate(RESOURCE, ["fake-2", "fake-0"])
            assert allocation.envs == {"FAKE_VISIBLE_DEVICES": "fake-2,fake-0"}
            assert [d.container_path for d in allocation.devices] == ["/dev/fake-2", "/dev/fake-0"]
            assert allocation.cdi_devices == ("example.com/fake=fake-2", "example.com/fake=fake-0")
        assert not (dp / reg.endpoint).exists()  # SIGTERM removed it


async def test_state_file_edits_reach_the_kubelet(short_dir: Path) -> None:
    dp, state = short_dir / "dp", short_dir / "state" / "devices.json"
    state.parent.mkdir()
    write_state(state, [{"id": "a"}, {"id": "b", "numa_node": 1}])
    async with FakeKubelet(dp) as kubelet, devplug_fake(dp, "--state-file", str(state)):
        await kubelet.wait_for_devices(
            RESOURCE, lambda ds: ids_health(ds) == [("a", "Healthy"), ("b", "Healthy")]
        )
        # An atomic rename.
        write_state(state, [{"id": "a", "health": "Unhealthy"}, {"id": "b"}])
        await kubelet.wait_for_devices(
            RESOURCE, lambda ds: ids_health(ds) == [("a", "Unhealthy"), ("b", "Healthy")]
        )
        # An edit in place.
        write_state(state, [{"id": "a"}, {"id": "b"}, {"id": "c"}], atomic=False)
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 3)
        # An invalid file: logged, the last good state is kept, and the next good one applies.
        state.write_text('{"devices": [{"id": "a", "health": "sick"}]}')
        state.unlink()  # deleted: the last state is kept too
        write_state(state, [{"id": "z"}])  # re-created
        devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: [d.id for d in ds] == ["z"])
        assert len(devices) == 1
        # No list the kubelet received ever came from the invalid or missing file.
        assert all(lst for lst in kubelet.resource(RESOURCE).raw_lists)


async def test_kubelet_restarts_during_edits_lose_no_update(short_dir: Path) -> None:
    dp, state = short_dir / "dp", short_dir / "devices.json"
    write_state(state, [{"id": "d0"}])
    async with FakeKubelet(dp) as kubelet, devplug_fake(dp, "--state-file", str(state)):
        await kubelet.wait_for_devices(RESOURCE)

        async def edit() -> None:
            for n in range(1, 41):
                write_state(state, [{"id": f"d{i}"} for i in range(n)])
                await anyio.sleep(0.005)

        async def restart() -> None:
            for _ in range(8):
                await anyio.sleep(0.02)
                await kubelet.restart()

        async with anyio.create_task_group() as tg:
            tg.start_soon(edit)
            tg.start_soon(restart)
        # Whatever the interleaving, the last state written is the last state seen.
        devices = await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 40, timeout=5)
        assert [d.id for d in devices] == [f"d{i}" for i in range(40)]
        # At most one registration per kubelet start (two restart signals, one registration);
        # fewer when a restart came before the plugin had registered with the previous kubelet.
        assert 2 <= sum(r.accepted for r in kubelet.registrations) <= 9


async def test_bad_flag_and_bad_scenario_exit_2(short_dir: Path) -> None:
    scenario = short_dir / "scenario.yaml"
    scenario.write_text("resources:\n  - name: example.com/gpu\n    count: many\n")
    for args, expected in (
        (["--count", "-1"], "invalid setting --count: Input should be greater than or equal to 0"),
        (["--config", str(scenario)], "invalid setting resources.0.count: Input should be a valid integer"),
    ):
        result = await anyio.run_process(
            [sys.executable, "-m", "devplug_fake", *args],
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert result.returncode == 2
        err = result.stderr.decode()
        assert err.count("\n") == 1 and expected in err, err


def test_demo_runs_and_leaves_nothing_behind() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "demo"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for step in ("registered example.com/fake", "Allocate(fake-1, fake-3)", "fake-2 marked Unhealthy",
                 "fake-2 marked Healthy", "re-registered on", "exited with 0, socket removed"):  # fmt: skip
        assert step in out, step
    workdir = re.search(r"work directory (\S+)", out)
    assert workdir is not None
    assert not Path(workdir.group(1)).exists()


def test_dra_demo_runs_and_leaves_nothing_behind() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "demo", "--dra"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for step in (
        "registered fake.example.com through fake.example.com-reg.sock, service v1.DRAPlugin",
        "ResourceSlices published: 1 slice, pool demo-node generation 1",
        "NodePrepareResources answered",
        "fake-2 marked Unhealthy: the kubelet's health stream saw it",
        "taint published",
        "taint removed",
        "slices restored by the driver",
        "the same answer, from the checkpoint",
        "CDI spec removed",
        "driver exited with 0, sockets removed",
    ):
        assert step in out, step
    workdir = re.search(r"work directory (\S+)", out)
    assert workdir is not None
    assert not Path(workdir.group(1)).exists()
