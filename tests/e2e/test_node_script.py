"""e2e/node as a user meets it: careless input, a second `up`, `down` with nothing up, a failure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.node_kit import ROOT, Node, localnode, wait_for

pytestmark = pytest.mark.timeout(300)
NODE = ROOT / "e2e" / "node"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(NODE), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=dict(os.environ, **(env or {})),
    )


def test_careless_input_is_one_line_and_status_2(tmp_path: Path) -> None:
    for args in (["build", "--k8s", "1.37"], ["up", "--k8s", "latest"], ["up", "--node-name", "Bad_Name"]):
        res = run(*args)
        assert res.returncode == 2, (args, res)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith("e2e/node: "), res.stderr
    res = run("bogus")
    assert res.returncode == 2
    assert "invalid choice" in res.stderr


def test_down_and_env_with_nothing_up_are_harmless(tmp_path: Path) -> None:
    res = run("down", "--run-dir", str(tmp_path / "typo"))
    assert res.returncode == 0
    assert res.stderr.strip() == f"e2e/node: nothing is up in {tmp_path / 'typo'}"
    assert not (tmp_path / "typo").exists()
    res = run("env", "--run-dir", str(tmp_path / "typo"))
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1


def test_up_twice_prints_the_same_line(node: Node) -> None:
    res = run("up", "--run-dir", str(node.run))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        f"export KUBECONFIG={node.kubeconfig} KUBELET_ROOT={node.kubelet_root} "
        f"CDI_DIR={node.cdi_dir} NODE_NAME={node.name}"
    )
    assert "already up" in res.stderr
    assert run("env", "--run-dir", str(node.run)).stdout == res.stdout


def test_a_component_that_fails_is_named_with_its_log_and_nothing_is_left(node: Node, tmp_path: Path) -> None:
    """A cache whose etcd exits at once: up fails in one line naming etcd and its log, and cleans up."""
    cache = tmp_path / "cache"
    real = localnode.CACHE
    for entry in real.iterdir():
        if entry.is_dir() and (entry / "bin").is_dir():
            (cache / entry.name / "bin").mkdir(parents=True)
            for binary in (entry / "bin").iterdir():
                (cache / entry.name / "bin" / binary.name).symlink_to(binary)
    (cache / localnode.images_dir().name).mkdir()
    for tar in ("pause.tar", "busybox.tar"):  # what up imports (not the cached devplug images)
        shutil.copy(localnode.images_dir() / tar, cache / localnode.images_dir().name / tar)
    for etcd in cache.glob("etcd-*/bin/etcd"):
        etcd.unlink()
        etcd.write_text("#!/bin/sh\necho 'etcd: refusing to start (test)' >&2\nexit 3\n")
        etcd.chmod(0o755)
    run_dir = tmp_path / "run"
    res = run("up", "--run-dir", str(run_dir), env={"DEVPLUG_E2E_CACHE": str(cache)})
    assert res.returncode == 1, res
    last = res.stderr.strip().splitlines()[-1]
    assert last == f"e2e/node: etcd exited with status 3 while starting; log: {run_dir / 'logs' / 'etcd.log'}"
    assert "refusing to start" in (run_dir / "logs" / "etcd.log").read_text()
    assert sorted(p.name for p in run_dir.iterdir()) == ["logs"]  # certificates, state: all gone
    assert res.stdout == ""


def _sysctl(key: str) -> Path:
    return Path("/proc/sys/" + key.replace(".", "/"))


def test_down_stops_what_up_started_and_cleans_up(node: Node) -> None:
    """A second node beside the session's (own ports, run directory, namespace): a pod runs on
    it; after `down` none of its processes, mounts, cgroups or sockets are left, and the sysctls
    the kubelet changed are back."""
    run_dir = Path(tempfile.mkdtemp(prefix="dpn-", dir="/tmp"))  # short: unix socket paths under it
    oops = _sysctl("kernel.panic_on_oops")
    saved = oops.read_text()
    oops.write_text("0\n")  # the kubelet sets 1
    try:
        up = run("up", "--run-dir", str(run_dir), "--node-name", "second")
        assert up.returncode == 0, up.stderr
        env = dict(item.split("=", 1) for item in up.stdout.strip().removeprefix("export ").split())
        assert env["NODE_NAME"] == "second"
        assert env["KUBECONFIG"] != node.kubeconfig
        assert oops.read_text() == "1\n"
        second = Node(run=run_dir, env=env)
        second.run_pod("on-second")
        state = json.loads((run_dir / "state.json").read_text())
        started = list(state["processes"].values())
        cgroup_root = state["cgroup_root"]
        assert all(localnode.alive(entry) for entry in started)
        net, session_net = state["net"], json.loads((node.run / "state.json").read_text())["net"]
        assert net["bridge"] != session_net["bridge"] and net["subnet"] != session_net["subnet"]
        assert Path("/sys/class/net", net["bridge"]).exists()

        down = run("down", "--run-dir", str(run_dir))
        assert down.returncode == 0, down.stderr
        assert "stopped etcd, kube-apiserver" in down.stderr
        assert not [entry for entry in started if localnode.alive(entry)]  # (a zombie has ended)
        leftovers = [
            line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(run_dir) in line
        ]
        assert leftovers == []
        assert sorted(p.name for p in run_dir.iterdir()) == ["logs"]
        assert not [p for p in Path("/sys/fs/cgroup").glob("*" + cgroup_root) if p.exists()]
        address = str(run_dir / "containerd")
        shims = [p for p in Path("/proc").iterdir() if p.name.isdigit() and address in _cmdline(p)]
        assert shims == []
        assert oops.read_text() == "0\n"
        assert not Path("/sys/class/net", net["bridge"]).exists()
        assert Path("/sys/class/net", session_net["bridge"]).exists()
        assert node.get("node", node.name, namespace="")  # the session's node is untouched
        again = run("down", "--run-dir", str(run_dir))
        assert again.returncode == 0
    finally:
        run("down", "--run-dir", str(run_dir))
        oops.write_text(saved)
        shutil.rmtree(run_dir, ignore_errors=True)


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize(
    "signals",
    [(signal.SIGTERM,), (signal.SIGINT,), (signal.SIGINT, signal.SIGINT)],
    ids=["sigterm", "sigint", "sigint-twice"],
)
def test_a_signal_while_up_starts_takes_down_what_it_started(
    node: Node, signals: tuple[signal.Signals, ...]
) -> None:
    """Ctrl-C (twice: the second during the clean-up) or SIGTERM while `up` starts the node."""
    run_dir = Path(tempfile.mkdtemp(prefix="dpn-", dir="/tmp"))
    try:
        proc = subprocess.Popen(
            [str(NODE), "up", "--run-dir", str(run_dir), "--node-name", "cut-short"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        state = run_dir / "state.json"

        def mid_start() -> bool:
            assert proc.poll() is None, proc.communicate()
            return state.is_file() and "kube-apiserver" in state.read_text()

        wait_for("the node mid-start (kube-apiserver in its state)", mid_start, timeout=60, every=0.05)
        for how in signals:
            proc.send_signal(how)
            time.sleep(0.3)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert (
            err.strip().splitlines()[-1]
            == "e2e/node: interrupted; what was started is stopped and cleaned up"
        )
        assert out == ""
        assert sorted(p.name for p in run_dir.iterdir()) == ["logs"]
        assert not [
            line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(run_dir) in line
        ]
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(run_dir) in _cmdline(p)]
    finally:
        run("down", "--run-dir", str(run_dir))
        shutil.rmtree(run_dir, ignore_errors=True)
