"""bench/real_api.py, devplug beside the Go anchors on a real API server: a quick run keeps it working.

The quick run builds the Go anchors of bench/go once (cached under ~/.cache/devplug-e2e) and
needs the kube-apiserver and etcd that ``e2e/node build`` makes; without them the test is
skipped with the reason, and fails where ``DEVPLUG_E2E_REQUIRED`` is set (CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "real_api.py"
sys.path.insert(0, str(ROOT / "bench"))
import real_api  # noqa: E402  (bench/ is not a package)


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_BENCH_")}
    env.update(extra)
    return env


def _run(env: dict[str, str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    figures: dict[str, Any] = json.loads(done.stdout)["real_api"]
    return figures


def _unavailable(reason: str) -> None:
    if os.environ.get("DEVPLUG_E2E_REQUIRED"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def test_without_an_api_server_the_section_says_why(tmp_path: Path) -> None:
    figures = _run(_environment(KUBEBUILDER_ASSETS=str(tmp_path)), timeout=60)
    reason = f"no kube-apiserver in {tmp_path} (KUBEBUILDER_ASSETS; e2e/node build makes one)"
    assert figures == {"skipped": reason}
    misses: list[str] = []
    assert "Not measured in this run" in "\n".join(real_api.render({"real_api": figures}, misses))
    assert not misses


def test_quick_run_has_devplug_and_the_go_helper_side_by_side() -> None:
    assets = real_api.assets()
    if not (assets / "kube-apiserver").is_file():
        _unavailable(f"no kube-apiserver in {assets} (KUBEBUILDER_ASSETS; e2e/node build makes one)")
    built = all((real_api.anchors_dir() / name).is_file() for name in real_api.BINARIES)
    if not built and shutil.which("go") is None:
        _unavailable("no Go toolchain to build the anchors of bench/go")
    figures = _run(_environment(), timeout=600 if not built else 180)

    prepare = figures["prepare"]
    for side in ("devplug", "go_helper"):
        for key in ("prepare_1", "prepare_8", "unprepare_1", "unprepare_8"):
            assert prepare[side][key]["runs"] >= 1 and prepare[side][key]["p50"] > 0, (side, key)
    assert set(prepare["ratio_p50"]) == set(prepare["ratio_p99"]) == set(prepare["devplug"])
    assert "kubelet/cm/dra/plugin" in prepare["client"]

    (publication,) = figures["publication"].values()
    for side in ("devplug", "go_helper"):
        entry = publication[side]
        assert entry["slices"] >= 1
        assert entry["first_request_to_complete"]["p50"] > 0
        assert entry["start_to_complete"]["p50"] >= entry["first_request_to_complete"]["p50"]
    assert figures["wipes"]["devplug"]["runs"] >= 1

    plugin = figures["device_plugin"]
    assert "devicemanager/plugin/v1beta1" in plugin["client"]
    for key in ("start_to_register", "kubelet_restart_to_register", "plugin_restart_to_register"):
        assert plugin["devplug_fake"][key]["runs"] >= 1, key

    assert {"prepare_p50_1", "prepare_p99_8", "wipe_p99"} <= set(figures["targets"])
    missed = [key for key, target in figures["targets"].items() if not target["met"]]
    if any(key.startswith("prepare_") for key in missed):
        prof = figures["profiles"]["prepare"]
        assert prof["by_own_time"]
        assert prof["pieces_p50_ms"]["claim_get"] > 0 and prof["client_p50_ms"]["prepare_1"] > 0
        notes = real_api.explain({"real_api": figures}, [f"real_api_{key}" for key in missed])
        assert "Where devplug's time goes" in "\n".join(notes)

    misses: list[str] = []
    page = "\n".join(real_api.render({"real_api": figures}, misses))
    assert "Go helper p50" in page and "kubelet restart → Register" in page
    assert sorted(misses) == sorted(f"real_api_{key}" for key in missed)
