"""e2e/node as a user meets it: careless input, a second `up`, `down` with nothing up, a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.node_kit import ROOT, Node, localnode

pytestmark = pytest.mark.timeout(300)
NODE = ROOT / "e2e" / "node"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NODE), *args], capture_output=True, text=True, timeout=240, check=False,
                          env=dict(os.environ, **(env or {})))


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
    assert res.stdout.strip() == (f"export KUBECONFIG={node.kubeconfig} KUBELET_ROOT={node.kubelet_root} "
                                  f"CDI_DIR={node.cdi_dir} NODE_NAME={node.name}")
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
    shutil.copytree(localnode.images_dir(), cache / localnode.images_dir().name)
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
