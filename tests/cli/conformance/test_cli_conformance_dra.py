"""``devplug conformance --dra`` as a process: devplug-fake as a DRA driver passes, a broken driver fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conformance.test_cli_conformance import conformance, table

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = str(ROOT / "tests" / "testing" / "conformance" / "dra_script_driver.py")
FAKE = [
    sys.executable,
    "-m",
    "devplug_fake",
    "--api",
    "device-plugin,dra",
    "--driver-name",
    "fake.example.com",
]
PLACES = ["--kubelet-root", "{kubelet_root}", "--cdi-dir", "{cdi_dir}"]


def test_devplug_fake_as_a_dra_driver_passes() -> None:
    result = conformance("--dra", "--", *FAKE, "--shares", "2", *PLACES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "driver: fake.example.com" in result.stdout
    rows = table(result.stdout)
    assert len(rows) == 13
    assert {mark for mark, _ in rows.values()} == {"PASS"}
    assert "13 passed, 0 failed, 0 skipped" in result.stdout


def test_json_report_of_a_broken_driver() -> None:
    result = conformance("--dra", "--json", "--timeout", "3", "--", sys.executable, SCRIPT, *PLACES,
                         "--fault", "exit-1")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["api"] == "dra"
    assert report["passed"] is False
    assert report["resource"] == "script.example.com"
    failed = [r for r in report["results"] if r["status"] == "fail"]
    assert [r["name"] for r in failed] == ["sigterm_clean"]
    assert "exited with status 1" in failed[0]["reason"]


def test_the_driver_option_picks_the_driver() -> None:
    # Another name than the one registered: nothing of it ever registers.
    result = conformance("--dra", "--driver", "other.example.com", "--timeout", "2", "--",
                         sys.executable, SCRIPT, *PLACES)  # fmt: skip
    assert result.returncode == 1
    rows = table(result.stdout)
    assert rows["get_info"][0] == "FAIL"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dra", "--resource", "x/y", "--", "true"], "--resource is for device plugins"),
        (["--dra", "--restarts", "1", "--", "true"], "--restarts is for device plugins"),
        (["--driver", "d.example.com", "--", "true"], "--driver goes with --dra"),
        (["--node", "n", "--", "true"], "--node goes with --dra"),
        (
            ["--dra", "--", "/nonexistent/driver"],
            "cannot start /nonexistent/driver: no such file or directory",
        ),
    ],
)
def test_bad_invocation_exits_2(args: list[str], message: str) -> None:
    result = conformance(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr


def test_help_names_the_placeholders() -> None:
    result = subprocess.run([sys.executable, "-m", "devplug", "conformance", "--help"], capture_output=True,
                            text=True, timeout=30, check=False, cwd=ROOT)  # fmt: skip
    assert "{kubelet_root}" in result.stdout
    assert "--dra" in result.stdout
