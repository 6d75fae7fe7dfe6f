"""The README's "Try it on a real local node" blocks, run as written on the session's node.

`e2e/node up` finds the session's node already up (DEVPLUG_E2E_RUN points at it) and prints its
export line; the last block (`e2e/node down`) is the session's own teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import blocks
from tests.e2e.node_kit import ROOT, Node, stop_process

pytestmark = pytest.mark.timeout(300)

SECTION = "## Try it on a real local node (no Docker needed)"


def node_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + 1)
    first = text.count("\n", 0, start) + 1
    last = text.count("\n", 0, end) + 1
    return [b.text for b in blocks(ROOT / "README.md") if first <= b.line <= last and b.lang == "sh"]


def test_the_section_has_the_three_commands_and_both_apis() -> None:
    found = node_blocks()
    assert len(found) == 4
    assert found[0].splitlines()[:2] == ["e2e/node build", 'eval "$(e2e/node up)"']
    assert "devplug-fake --kubelet-root" in found[1]
    assert "--api dra" in found[2]
    assert found[3].strip() == "e2e/node down"


def test_the_blocks_serve_a_pod_through_both_apis(node: Node, tmp_path: Path) -> None:
    start, device_plugin, dra, _down = node_blocks()
    venv = str(Path(sys.executable).parent) + "/"
    script = "set -e\n" + "\n".join((start, device_plugin, dra)).replace(".venv/bin/", venv)
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBELET_ROOT", "CDI_DIR", "NODE_NAME")
    }
    env["DEVPLUG_E2E_RUN"] = str(node.run)
    out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
    with out_file.open("wb") as out, err_file.open("wb") as err:
        # its own process group: what the blocks start in the background goes with it, whatever happens
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=240)
        finally:
            stop_process(proc)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    out, stderr = out_file.read_text(), err_file.read_text()
    assert rc == 0, f"{out}\n{stderr}"
    assert node.name in out  # kubectl get nodes
    # each pod printed its FAKE_VISIBLE_DEVICES: two devices from the device plugin, one from DRA
    seen = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("FAKE_VISIBLE_DEVICES=")]
    assert [len(v.split(",")) for v in seen] == [2, 1], out
    assert "already up" in stderr
