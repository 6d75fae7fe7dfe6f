"""The devplug command as a real process: registration, signals, bad options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.support import wait_until

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "example.com/widget"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize(
    "signums",
    [(signal.SIGTERM,), (signal.SIGINT,), (signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT)],
    ids=["term", "int", "term-term", "int-int"],
)
async def test_signal_removes_socket_and_exits_0(
    short_dir: Path, signums: tuple[signal.Signals, ...]
) -> None:
    """One signal, or a second one 2 ms later (during the clean-up): exit 0, the socket removed."""
    dp = short_dir / "dp"
    log_path = short_dir / "plugin.log"
    async with FakeKubelet(dp) as kubelet:
        with log_path.open("w") as log:
            process = await anyio.open_process(
                [
                    sys.executable,
                    "-m",
                    "devplug",
                    "run",
                    "tests.support:Widgets",
                    "--device-plugin-dir",
                    str(dp),
                ],
                cwd=ROOT,
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            async with process:
                reg = await kubelet.wait_for_registration(RESOURCE, timeout=10)
                await kubelet.wait_for_devices(RESOURCE)
                assert (dp / reg.endpoint).is_socket()
                # The kubelet has the devices before Register's answer reaches the plugin (it
                # dials back during Register): signal once the plugin itself says so.
                await wait_until(
                    lambda: '"registered"' in log_path.read_text(), what="the plugin's registered"
                )
                for signum in signums:
                    signal_child(process, signum)
                    await anyio.sleep(0.002)
                with anyio.fail_after(2):
                    assert await process.wait() == 0
        assert not (dp / reg.endpoint).exists()
        assert kubelet.socket_path.is_socket()  # only its own socket is removed
    assert "Traceback" not in log_path.read_text()
    records = [json.loads(line) for line in log_path.read_text().splitlines()]  # JSON: not a TTY
    events = [r["event"] for r in records]
    last_stop = len(events) - 1 - events[::-1].index("stopped")
    # a second signal may reach the event loop after the clean-up logged `stopped`: it is only
    # logged as such, nothing else happens after the stop
    after = records[last_stop + 1 :]
    assert all(r["event"] == "signal_received" and r.get("action") == "already stopping" for r in after), (
        after
    )
    assert len(after) <= len(signums) - 1
    assert "signal_received" in events
    assert events.index("registered") < events.index("signal_received")


def test_bad_option_exits_2_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "run", "tests.support:Widgets", "--retry-max", "-3"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "devplug run tests.support:Widgets: invalid setting --retry-max: must be greater than 0 (got '-3')"
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.support", "expected MODULE:CLASS"),
        ("no_such_module:X", "cannot import no_such_module"),
        ("tests.support:Nope", "has no attribute Nope"),
        ("tests.support:settings_for", "is not a DevicePlugin"),
    ],
)
def test_run_bad_target(target: str, message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "run", target],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
