"""``devplug kubelet claim`` and ``kubectl apply`` against a running ``devplug kubelet --dra``; a
restarted one on the same root keeping its API server's address; a second one on a served
directory refused. Every command is a real process."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from devplug.cli.kubelet.guard import LOCK_NAME, previous_port
from devplug.testing._process import signal_child
from tests.cli.kubelet.test_cli_kubelet import devplug_kubelet, read_until, write_state
from tests.cli.kubelet.test_cli_kubelet_dra import STOPPED, kubelet_dra, read_all

ROOT = Path(__file__).resolve().parents[3]
DRIVER = "fake.example.com"


@asynccontextmanager
async def fake_driver(head: str, state: Path) -> AsyncIterator[Process]:
    """devplug-fake started from the command ``devplug kubelet --dra`` printed first."""
    line = shlex.split(head.splitlines()[1])
    argv = [sys.executable, "-m", "devplug_fake", *line[1:], f"--state-file={state}"]
    async with await anyio.open_process(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as fake:
        yield fake
        signal_child(fake, signal.SIGTERM)
        with anyio.fail_after(15):
            await fake.wait()


async def claim(*args: str) -> subprocess.CompletedProcess[str]:
    """``devplug kubelet claim ARGS`` run to its end."""
    command = [sys.executable, "-m", "devplug", "kubelet", "claim", *args]
    result = await anyio.run_process(command, cwd=ROOT, check=False)
    return subprocess.CompletedProcess(
        command, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


@pytest.mark.anyio
async def test_a_claim_is_allocated_prepared_and_unprepared_by_one_command(short_dir: Path) -> None:
    root = short_dir / "k"
    state = short_dir / "devices.json"
    write_state(state, [{"id": "fake-0"}, {"id": "fake-1"}])
    async with kubelet_dra(root) as (kubelet, out, seen, head), fake_driver(head, state):
        await read_all(out, [f"{DRIVER}: connected to", f"{DRIVER} pool: 2 devices"], seen)
        first = await claim("--kubelet-root", str(root), "first")
        assert first.returncode == 0, first.stderr
        lines = first.stdout.splitlines()
        assert lines[0] == f"claim default/first prepared: {DRIVER} node-1/fake-0"
        assert lines[1].startswith(f"CDI devices: k8s.{DRIVER}/claim=")
        await read_until(out, f"claim default/first prepared by {DRIVER}: CDI devices k8s.{DRIVER}/", seen)

        # The device asked for; then one that is taken: one line, status 1.
        second = await claim("--kubelet-root", str(root), "--driver", DRIVER, "--device", "fake-1", "second")
        assert second.returncode == 0, second.stderr
        assert second.stdout.startswith(f"claim default/second prepared: {DRIVER} node-1/fake-1\n")
        taken = await claim("--kubelet-root", str(root), "--device", "fake-0", "third")
        assert taken.returncode == 1
        assert taken.stderr.count("\n") == 1
        assert "not allocated: " in taken.stderr
        assert "device fake-0 is allocated to claim default/first" in taken.stderr
        again = await claim("--kubelet-root", str(root), "first")
        assert (again.returncode, again.stderr) == (
            1,
            "devplug kubelet claim: claim default/first exists: delete it first "
            "(devplug kubelet claim --delete)\n",
        )

        deleted = await claim("--kubelet-root", str(root), "--delete", "first")
        assert (deleted.returncode, deleted.stdout) == (
            0,
            "claim default/first deleted; the kubelet unprepares it\n",
        )
        await read_until(out, f"claim default/first deleted; unprepared by {DRIVER}\n", seen)
        gone = await claim("--kubelet-root", str(root), "--delete", "first")
        assert (gone.returncode, gone.stderr) == (1, "devplug kubelet claim: no claim default/first\n")
        signal_child(kubelet, signal.SIGTERM)
        await read_until(out, STOPPED, seen)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["Bad_Name"], "NAME 'Bad_Name': a lowercase DNS subdomain"),
        (["--device", "a", "--count", "2", "c"], "--device and --count cannot go together"),
        (["--count", "0", "c"], "--count 0: at least 1"),
        (["--delete", "--device", "a", "c"], "--delete takes the claim's NAME only"),
        (["c"], "kubeconfig not found: is 'devplug kubelet --dra --kubelet-root "),
    ],
    ids=["bad-name", "device-and-count", "count-0", "delete-with-device", "no-kubelet"],
)
def test_bad_claim_flags_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = devplug_kubelet("claim", "--kubelet-root", str(tmp_path), *args)
    assert result.returncode == 2
    assert result.stderr.startswith("devplug kubelet claim: error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.anyio
async def test_kubectl_apply_of_a_claim_gets_it_prepared(short_dir: Path) -> None:
    from tests.testing.kubeapi.test_kubeapi_kubectl import _binary

    kubectl = _binary()  # skipped, saying why, without kubectl; CI's e2e node build makes one
    root = short_dir / "k"
    state = short_dir / "devices.json"
    write_state(state, [{"id": "fake-0"}])
    manifest = short_dir / "claim.yaml"
    # A DeviceClass is not served: the claim's class names the driver.
    manifest.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: applied\n"
        "spec:\n  devices:\n    requests:\n    - name: gpu\n"
        f"      exactly:\n        deviceClassName: {DRIVER}\n"
    )
    env = {**os.environ, "KUBECONFIG": str(root / "kubeconfig"), "KUBECACHEDIR": str(short_dir / "cache")}
    async with kubelet_dra(root) as (kubelet, out, seen, head), fake_driver(head, state):
        await read_all(out, [f"{DRIVER}: connected to", f"{DRIVER} pool: 1 device"], seen)
        applied = await anyio.run_process([str(kubectl), "apply", "-f", str(manifest)], env=env, check=False)
        assert applied.returncode == 0, applied.stderr.decode()
        await read_until(out, f"claim default/applied prepared by {DRIVER}: CDI devices k8s.{DRIVER}/", seen)
        deleted = await anyio.run_process([str(kubectl), "delete", "-f", str(manifest)], env=env, check=False)
        assert deleted.returncode == 0, deleted.stderr.decode()
        await read_until(out, f"claim default/applied deleted; unprepared by {DRIVER}\n", seen)
        signal_child(kubelet, signal.SIGTERM)
        await read_until(out, STOPPED, seen)


@pytest.mark.anyio
async def test_kubectl_applying_a_kind_not_served_says_so(tmp_path: Path) -> None:
    """A DeviceClass (or a Pod) is in no OpenAPI v3 document: kubectl then reads /openapi/v2,
    and reports that the kind is not served. (It used to fail with "failed to download
    openapi", for the whole file, before a claim in it was applied.)"""
    from devplug.testing import FakeKubeAPI
    from tests.testing.kubeapi.test_kubeapi_kubectl import _binary

    kubectl = _binary()
    manifest = tmp_path / "all.yaml"
    manifest.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: fake\nspec: {}\n---\n"
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: c\n"
        "spec:\n  devices:\n    requests:\n    - name: r\n      exactly:\n        deviceClassName: fake\n"
    )
    async with FakeKubeAPI() as api:
        env = {**os.environ, "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig"))}
        env["KUBECACHEDIR"] = str(tmp_path / "cache")
        result = await anyio.run_process([str(kubectl), "apply", "-f", str(manifest)], env=env, check=False)
        err = result.stderr.decode()
        assert result.returncode == 1
        assert "failed to download openapi" not in err
        assert 'no matches for kind "DeviceClass" in version "resource.k8s.io/v1"' in err
        assert result.stdout.decode() == "resourceclaim.resource.k8s.io/c created\n"
        assert api.claim("default", "c")["spec"]["devices"]["requests"][0]["name"] == "r"


@pytest.mark.anyio
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
async def test_a_restart_on_the_same_root_keeps_the_address_and_the_driver_publishes_again(
    short_dir: Path, stop: signal.Signals
) -> None:
    """The driver read the kubeconfig once, at its start: the new API server is at the same
    address, so its slices appear there. (It used to get a new port: the driver's API server was
    unreachable for ever.)"""
    root = short_dir / "k"
    state = short_dir / "devices.json"
    write_state(state, [{"id": "fake-0"}, {"id": "fake-1"}])
    async with kubelet_dra(root) as (kubelet, out, seen, head):
        url = head.split("API server ", 1)[1].split()[0]
        assert previous_port(root / "kubeconfig") == int(url.rsplit(":", 1)[1])
        async with fake_driver(head, state):
            await read_all(out, [f"{DRIVER} pool: 2 devices: fake-0, fake-1\n"], seen)
            signal_child(kubelet, stop)
            with anyio.fail_after(15):
                await kubelet.wait()
            async with kubelet_dra(root) as (again, out2, seen2, head2):
                assert f"API server {url} with node node-1" in head2
                await read_all(out2, [f"{DRIVER} pool: 2 devices: fake-0, fake-1\n"], seen2)
                signal_child(again, signal.SIGTERM)
                await read_until(out2, STOPPED, seen2)


@pytest.mark.anyio
async def test_a_second_kubelet_on_a_served_directory_is_refused_and_a_killed_ones_lock_does_not_count(
    short_dir: Path,
) -> None:
    directory = short_dir / "dp"
    command = [sys.executable, "-m", "devplug", "kubelet", "--dir", str(directory)]
    async with await anyio.open_process(command, cwd=ROOT, stderr=subprocess.STDOUT) as first:
        assert first.stdout is not None
        out = anyio.streams.text.TextReceiveStream(first.stdout)
        await read_until(out, "Ctrl-C to stop\n", [""])
        second = devplug_kubelet("--dir", str(directory))
        assert second.returncode == 2
        assert second.stderr == (
            f"devplug kubelet: another devplug kubelet (pid {first.pid}) serves {directory}; stop it first\n"
        )
        # The first one still serves its socket.
        assert (directory / "kubelet.sock").is_socket()
        signal_child(first, signal.SIGKILL)
        await first.wait()
    # Killed: its lock file and socket stay, and block nothing.
    assert (directory / LOCK_NAME).exists()
    async with await anyio.open_process(command, cwd=ROOT, stderr=subprocess.STDOUT) as third:
        assert third.stdout is not None
        seen = [""]
        await read_until(anyio.streams.text.TextReceiveStream(third.stdout), "Ctrl-C to stop\n", seen)
        signal_child(third, signal.SIGTERM)
        with anyio.fail_after(15):
            assert await third.wait() == 0
    assert list(directory.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "port"),
    [
        (json.dumps({"clusters": [{"cluster": {"server": "http://127.0.0.1:4321"}}]}), 4321),
        (json.dumps({"clusters": [{"cluster": {"server": "https://10.0.0.1:6443"}}]}), 0),
        ("not json", 0),
        (json.dumps({"clusters": []}), 0),
        (None, 0),
    ],
    ids=["ours", "another-host", "garbage", "no-cluster", "missing"],
)
def test_previous_port(tmp_path: Path, text: str | None, port: int) -> None:
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    assert previous_port(path) == port
