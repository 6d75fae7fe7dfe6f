from __future__ import annotations

import os
import subprocess
import sys


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if k not in ("MIG_STRATEGY", "CONFIG_FILE", "FAIL_ON_INIT_ERROR")
    }
    return subprocess.run(
        [sys.executable, "-m", "devplug_nvidia", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=base | (env or {}),
    )


def test_help_lists_nvidia_flags() -> None:
    proc = _run("--help")
    assert proc.returncode == 0
    for flag in (
        "--mig-strategy",
        "--fail-on-init-error",
        "--device-list-strategy",
        "--config-file",
        "--kubelet-socket",
        "--fake-nvml",
        "--device-plugin-dir",
    ):
        assert flag in proc.stdout


def test_bad_flag_exit_2() -> None:
    proc = _run("--mig-strategy", "bogus")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
