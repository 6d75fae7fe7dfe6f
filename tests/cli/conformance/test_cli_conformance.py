"""``devplug conformance`` as a process: devplug-fake passes, each broken plugin fails its check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BROKEN = str(Path(__file__).parents[1] / "broken_plugins.py")


def conformance(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug", "conformance", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip


def table(out: str) -> dict[str, tuple[str, str]]:
    """check name -> (PASS/FAIL/SKIP, reason), from the printed table."""
    rows = {}
    for line in out.splitlines():
        mark, _, rest = line.partition("  ")
        if mark in ("PASS", "FAIL", "SKIP"):
            name, _, reason = rest.strip().partition(" ")
            rows[name] = (mark, reason.strip())
    return rows


def test_devplug_fake_passes() -> None:
    result = conformance("--", sys.executable, "-m", "devplug_fake", "--device-plugin-dir", "{dir}")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table(result.stdout)
    assert len(rows) == 12
    assert {name for name, (mark, _) in rows.items() if mark != "PASS"} == {"preferred_allocation"}
    assert rows["preferred_allocation"] == (
        "SKIP",
        "not offered (get_preferred_allocation_available is false)",
    )
    assert rows["re_registers_after_restart"][1].startswith("registered again after each of 3 restarts")
    assert "11 passed, 0 failed, 1 skipped" in result.stdout


def test_devplug_run_with_every_hook_passes_everything() -> None:
    # The directory comes from DEVPLUG_DEVICE_PLUGIN_DIR here, not from {dir}.
    result = conformance("--json", "--restarts", "1", "--", sys.executable, "-m", "devplug", "run",
                         "tests.support:PickyWidgets")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is True
    assert report["resource"] == "example.com/widget"
    assert {r["status"] for r in report["results"]} == {"pass"}


@pytest.mark.parametrize(
    ("mode", "failed", "reason"),
    [
        ("register-before-serving", "serves_before_registering", "Register arrived before broken-"),
        ("lowercase-health", "exact_health_strings", "device b0 sent with health 'healthy'"),
        (
            "no-reregister",
            "re_registers_after_restart",
            "no registration within 2 s after kubelet restart 1 of 1",
        ),
    ],
)
def test_broken_plugin_fails_its_check(mode: str, failed: str, reason: str) -> None:
    result = conformance("--timeout", "2", "--restarts", "1", "--", sys.executable, BROKEN, mode)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = table(result.stdout)
    assert {name for name, (mark, _) in rows.items() if mark == "FAIL"} == {failed}, result.stdout
    assert rows[failed][1].startswith(reason), rows[failed]


def test_plugin_that_never_registers() -> None:
    code = "import time; print('starting', flush=True); time.sleep(60)"
    result = conformance("--timeout", "1", "-v", "--", sys.executable, "-c", code)
    assert result.returncode == 1
    rows = table(result.stdout)
    assert rows["valid_registration"] == ("FAIL", "no Register call completed within 1 s")
    assert {mark for name, (mark, _) in rows.items() if name != "valid_registration"} == {"SKIP"}
    assert "plugin output (last lines):\n  starting" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no plugin command given"),
        (["--", "/nonexistent/plugin"], "cannot start /nonexistent/plugin: no such file or directory"),
        (["--restarts", "-1", "--", "true"], "must be 0 or more"),
    ],
)
def test_bad_invocation_exits_2(args: list[str], message: str) -> None:
    result = conformance(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr
