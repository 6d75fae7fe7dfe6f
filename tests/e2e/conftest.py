"""One real node (e2e/node up) for the whole session, in a run directory of the session's own.

The node is built if needed (cached in ~/.cache/devplug-e2e), started once, and taken down at the
end of the session, also when a test fails or the run is interrupted. A node left behind by a
session that was killed outright is taken down by the next session before it starts its own.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.node_kit import ROOT, Node, localnode

NODE_SCRIPT = ROOT / "e2e" / "node"
RUN_PREFIX = "devplug-e2e-tests-"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-node tests last (the node is up only while they run), and among them the
    `before_device_plugins` ones first: once a device plugin served a resource, the real kubelet
    keeps it as a registered resource for 5 minutes after the plugin went (its device manager's
    grace period), and handles a container's request for it itself ("endpoint not found in cache
    for a registered resource") even where the scheduler gave it through DRA (KEP-5004)."""
    here = Path(__file__).parent

    def order(item: pytest.Item) -> tuple[bool, bool, bool]:
        real_node = here in Path(item.path).parents
        deploy = Path(item.path).name == "test_deploy.py"  # DaemonSets: after the drivers on the host
        return real_node, item.get_closest_marker("before_device_plugins") is None, deploy

    items.sort(key=order)


def _down(run: Path) -> None:
    subprocess.run(
        [str(NODE_SCRIPT), "down", "--run-dir", str(run)], capture_output=True, timeout=120, check=False
    )


def _left_behind() -> None:
    """Nodes of earlier sessions whose pytest is gone (killed with SIGKILL, say)."""
    for run in Path(tempfile.gettempdir()).glob(RUN_PREFIX + "*"):
        owner = run.name.removeprefix(RUN_PREFIX)
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _down(run)
            subprocess.run(["rm", "-rf", str(run)], check=False)


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    if os.geteuid() != 0:
        reason = "the real node needs root: the kubelet and containerd manage mounts and cgroups"
        if os.environ.get("DEVPLUG_E2E_REQUIRED"):  # CI: a skipped real-node suite is a failure
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    _left_behind()
    run = Path(tempfile.gettempdir()) / f"{RUN_PREFIX}{os.getpid()}"
    atexit.register(_down, run)
    res = subprocess.run(
        [str(NODE_SCRIPT), "up", "--run-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if res.returncode != 0:
        _down(run)
        pytest.fail(f"e2e/node up failed: {res.stderr.strip().splitlines()[-1:]}", pytrace=False)
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("export "), res.stdout
    env = dict(item.split("=", 1) for item in line.removeprefix("export ").split())
    try:
        yield Node(run=run, env=env, version=localnode.DEFAULT_K8S)
    finally:
        _down(run)
        if not request.session.testsfailed:  # else its logs stay, until the next session's clean-up
            subprocess.run(["rm", "-rf", str(run)], check=False)
