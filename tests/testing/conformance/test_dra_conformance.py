"""run_dra_conformance against devplug-fake --api dra and against a small driver program with faults."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from devplug.testing import DRA_CHECKS, ConformanceReport, run_dra_conformance

pytestmark = pytest.mark.anyio

SCRIPT = [sys.executable, str(Path(__file__).with_name("dra_script_driver.py"))]
SCRIPT_ARGS = ["--kubelet-root", "{kubelet_root}", "--cdi-dir", "{cdi_dir}"]


# What a fault may break besides its own check.
ALSO = {
    # Unreachable at registration: the kubelet's first health stream fails, the next is 5 s later.
    "reg-first": ["health_full_list"],
    # Invalid slices never count as restored.
    "no-owner": ["slices_restored_after_wipe"],
    # Missing entries are that check's subject too.
    "skip-entry": ["entry_per_claim"],
}


def statuses(report: ConformanceReport) -> dict[str, str]:
    return {r.name: r.status for r in report.results}


async def test_devplug_fake_as_a_dra_driver_passes() -> None:
    command = [sys.executable, "-m", "devplug_fake", "--api", "device-plugin,dra"]
    command += ["--driver-name", "fake.example.com"]
    report = await run_dra_conformance(
        [*command, "--shares", "2", "--kubelet-root", "{kubelet_root}", "--cdi-dir", "{cdi_dir}"]
    )
    assert report.passed, (report.failures, report.output_tail)
    assert [r.name for r in report.results] == list(DRA_CHECKS)
    assert all(r.status == "pass" for r in report.results), report.results
    assert report.result("shared_devices").reason == "2 shares of fake-1 prepared and unprepared"
    assert report.result("both_apis").reason.startswith("withheld from DRA"), report.results
    assert re.fullmatch(r"1 slice, \d+ devices", report.result("slices_published").reason), report.results
    assert report.resource == "fake.example.com"
    assert report.api == "dra"
    assert "{kubelet_root}" not in " ".join(report.command)


async def test_a_correct_driver_program_passes() -> None:
    report = await run_dra_conformance([*SCRIPT, *SCRIPT_ARGS])
    assert report.passed, (report.failures, report.output_tail)
    assert report.resource == "script.example.com"
    # It publishes no shared device: that check has nothing to look at.
    assert {n: s for n, s in statuses(report).items() if s != "pass"} == {
        "shared_devices": "skip",
        "both_apis": "skip",
    }
    assert report.result("shared_devices").reason == "the driver publishes no shared device"
    assert (
        report.result("both_apis").reason
        == "no device-plugin resource registered: the driver serves DRA only"
    )


@pytest.mark.parametrize(
    ("fault", "check", "reason"),
    [
        ("reg-first", "dra_socket_first", "appeared before"),
        ("v1beta1-first", "versions", "list v1.DRAPlugin first"),
        ("no-owner", "slices_published", "no ownerReference to the Node"),
        ("skip-entry", "prepare_allocated_claim", "NodePrepareResources skipped 1 ResourceClaims"),
        ("bare-cdi", "prepare_allocated_claim", "is not fully qualified"),
        ("no-respec", "idempotent_prepare", "its spec was deleted (as by a reboot) and not written again"),
        ("no-restore", "slices_restored_after_wipe", "not within 5 s: no ResourceSlice for this node"),
        ("partial-health", "health_full_list", "leaves out 1 of 2 published devices"),
        ("exit-1", "sigterm_clean", "exited with status 1"),
        ("leave-socket", "sigterm_clean", "-reg.sock behind"),
    ],
)
async def test_each_fault_fails_its_check(fault: str, check: str, reason: str) -> None:
    # The driver with reg-first is reachable only after its gRPC reconnect back-off: more time.
    report = await run_dra_conformance(
        [*SCRIPT, *SCRIPT_ARGS, "--fault", fault], timeout=6 if fault == "reg-first" else 3
    )
    result = report.result(check)
    assert result.status == "fail", report.results
    assert reason in result.reason
    others = {r.name for r in report.failures} - {check}
    assert others <= set(ALSO.get(fault, [])), report.failures


async def test_the_environment_and_the_placeholders(short_dir: Path) -> None:
    # A driver that only records what it was given, then exits: nothing registers.
    probe = short_dir / "seen.txt"
    code = (
        "import os, sys; open(sys.argv[1], 'w').write("
        "'|'.join([os.environ['NODE_NAME'], os.environ['KUBECONFIG'], *sys.argv[2:]]))"
    )
    command = [
        sys.executable,
        "-c",
        code,
        str(probe),
        "{node}",
        "{kubeconfig}",
        "{kubelet_root}",
        "{cdi_dir}",
    ]
    report = await run_dra_conformance(command, node_name="worker-7", timeout=2)
    node, kubeconfig, *args = probe.read_text().split("|")
    assert node == "worker-7"
    assert args[:2] == ["worker-7", kubeconfig]
    assert args[2].endswith("/kubelet")
    assert args[3].endswith("/cdi")
    assert report.result("get_info").status == "fail"
    assert "before registering" in report.result("get_info").reason
    assert report.result("sigterm_clean").status == "skip"
    assert {r.status for r in report.results if r.name != "get_info"} == {"skip"}


async def test_a_command_that_cannot_start() -> None:
    with pytest.raises(FileNotFoundError):
        await run_dra_conformance(["/nonexistent/driver"])
    with pytest.raises(ValueError, match="no command"):
        await run_dra_conformance([])
