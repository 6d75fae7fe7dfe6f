"""bench/nvidia_real.py, the real-hardware check: on a fake machine model, and where NVML is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parents[3] / "bench" / "nvidia_real.py"


def _run(*args: str) -> tuple[int, dict[str, Any]]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DEVPLUG_", "MIG_STRATEGY", "CONFIG_FILE"))
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_every_step_on_a_fake_dgx_h100() -> None:
    code, report = _run("--fake-nvml", "dgx-h100")
    assert code == 0, report
    assert report["gpu"] is True and report["gpu_count"] == 8
    assert len(report["discovery"]) == 8
    assert set(report["link_matrix"]["nvlinks"].values()) == {18}
    assert report["preferred_allocation"]["4"]["chosen"] in (["0", "1", "2", "3"], ["4", "5", "6", "7"])
    assert report["labels"]["nvidia.com/gpu.family"] == "hopper"
    trip = report["event_round_trip"]
    assert trip["timeout"] is True and len(trip["registered"]) == 8
    for strategy in ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"):
        entry = report["plugin"][strategy]
        assert entry["devices"] == 8 and entry["healthy"] == 8, entry
        assert len(entry["preferred_2"]) == 2
    assert report["plugin"]["envvar"]["envs"]["NVIDIA_VISIBLE_DEVICES"].count("GPU-") == 2
    assert len(report["plugin"]["cdi-cri"]["cdi_devices"]) == 2


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    code, report = _run()
    assert code == 0
    assert report["gpu"] is False
    assert "libnvidia-ml.so.1" in report["reason"] or "pynvml" in report["reason"]
