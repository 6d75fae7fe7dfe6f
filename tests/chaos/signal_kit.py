"""SIGTERM / SIGINT at any moment of a devplug command's life, and what must hold afterwards.

A trial starts one command (the console script) as a real process in its own process group,
with a FakeKubelet (device plugins) or a FakeKubeAPI (DRA) serving in this process, sends a
burst of signals at one moment (a moment in seconds counts from the start, but never falls
before the process's ``main`` took SIGTERM over: before that line a signal ends any Python
program the default way), and returns every rule the exit broke:

* status 0, or 130 ("interrupted") only when the burst came before the process had started
  serving, that is before the fake kubelet or API server saw it (registration, or a published
  ResourceSlice); that line is then the only one on stderr about the signals;
* no ``Traceback`` on stderr;
* at most one log line per signal sent (``signal_received`` or ``interrupted``);
* nothing left behind: the plugin's sockets (only the fake kubelet's own remain), the DRA
  driver's registration and service sockets, CDI files, the ``--fake-nvml`` temporary tree.

Used by tests/chaos/test_signals_anytime.py (fixed moments) and scripts/signal_stress.py
(random ones, many tries).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from devplug.testing import FakeKubeAPI, FakeKubelet
from devplug.testing._process import signal_child
from tests.support import wait_until

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODE = "node-a"
DRIVER = "gpu.nvidia.com"
FAKE_TREE_PREFIX = "devplug-nvidia-fake-"
COMMANDS = ("run", "fake", "nvidia", "nvidia-dra")
Moment = float | str
"""Seconds after the process started, or "registered" (once the fake kubelet or API server
saw it), or "shutdown" (a SIGTERM once registered, then the burst 5 ms later)."""


@dataclass(frozen=True)
class Burst:
    """Signals sent ``gap`` seconds apart, to the process or to its whole process group."""

    signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)
    group: bool = False
    gap: float = 0.002

    def label(self) -> str:
        names = "+".join(s.name.removeprefix("SIG").lower() for s in self.signals)
        return f"{names}{'-group' if self.group else ''}"


BURSTS = {
    b.label(): b
    for b in (
        Burst((signal.SIGTERM,)),
        Burst((signal.SIGINT,)),
        Burst((signal.SIGTERM, signal.SIGTERM)),
        Burst((signal.SIGINT, signal.SIGINT), group=True),
        Burst((signal.SIGTERM, signal.SIGINT, signal.SIGTERM, signal.SIGINT, signal.SIGTERM), gap=0.0025),
    )
}


@dataclass
class Outcome:
    command: str
    moment: Moment
    burst: Burst
    status: int | None = None
    served: bool = False
    problems: list[str] = field(default_factory=list)
    stderr: str = ""


def _env(tmp: Path) -> dict[str, str]:
    drop = ("NODE_NAME", "CONFIG_FILE", "NVIDIA_DRIVER_ROOT", "MIG_STRATEGY", "CDI_ROOT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_") and k not in drop}
    return env | {"PYTHONPATH": str(ROOT), "TMPDIR": str(tmp / "t")}


def _command(name: str, tmp: Path, kubeconfig: Path | None) -> list[str]:
    dp = str(tmp / "dp")
    common = ["--log-format", "json"]
    if name == "run":
        return [str(BIN / "devplug"), "run", "tests.support:Widgets", "--device-plugin-dir", dp, *common]
    if name == "fake":
        return [str(BIN / "devplug-fake"), "--device-plugin-dir", dp, *common]
    if name == "nvidia":
        return [str(BIN / "devplug-nvidia"), "--fake-nvml", "dgx-a100", "--device-plugin-dir", dp, *common]
    assert kubeconfig is not None
    return [
        str(BIN / "devplug-nvidia"), "--api", "dra", "--fake-nvml", "dgx-a100", "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--kubelet-root", str(tmp / "k"), "--cdi-root", str(tmp / "cdi"),
        *common,
    ]  # fmt: skip


def _send(pid: int, burst: Burst) -> None:
    for i, signum in enumerate(burst.signals):
        if i:
            time.sleep(burst.gap)  # blocking on purpose: the gaps are a few ms
        try:
            (os.killpg if burst.group else os.kill)(pid, signum)
        except ProcessLookupError:
            return


def _leftovers(name: str, tmp: Path) -> list[str]:
    left = []
    if name == "nvidia-dra":
        kubelet = tmp / "k"
        left += [str(p) for p in kubelet.rglob("*") if p.is_socket()]
        cdi = tmp / "cdi"
        left += [str(p) for p in cdi.iterdir()] if cdi.is_dir() else []
    else:
        left += [str(p) for p in (tmp / "dp").iterdir() if p.name != "kubelet.sock"]
    tree = tmp / "t"
    left += [str(p) for p in tree.iterdir() if p.name.startswith(FAKE_TREE_PREFIX)] if tree.is_dir() else []
    return left


async def trial(name: str, moment: Moment, burst: Burst, tmp: Path, *, timeout: float = 30) -> Outcome:  # noqa: ASYNC109 - the wait for the exit
    """One start, one burst at ``moment``, the exit judged (``tmp`` must be short: sockets)."""
    outcome = Outcome(name, moment, burst)
    (tmp / "t").mkdir(parents=True, exist_ok=True)
    (tmp / "dp").mkdir(parents=True, exist_ok=True)
    err = tmp / "stderr"
    async with FakeKubeAPI() as api, FakeKubelet(tmp / "dp") as kubelet:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(tmp / "kc") if name == "nvidia-dra" else None
        with err.open("w") as out:
            process = await anyio.open_process(
                _command(name, tmp, kubeconfig),
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=_env(tmp),
                cwd=ROOT,
                start_new_session=True,
            )
            started = time.monotonic()
            async with process:
                try:
                    if isinstance(moment, float | int):
                        # Not before main's first line: a signal while the interpreter starts
                        # ends any Python program the default way (outside what is judged).
                        await until_main(process.pid, timeout)
                        await anyio.sleep(max(0.0, started + moment - time.monotonic()))
                    else:
                        await _served(name, kubelet, api, timeout)
                        outcome.served = True
                        if moment == "shutdown":
                            os.kill(process.pid, signal.SIGTERM)
                            await anyio.sleep(0.005)
                    _send(process.pid, burst)
                    with anyio.move_on_after(timeout):
                        outcome.status = await process.wait()
                finally:
                    if outcome.status is None:
                        outcome.problems.append(f"still running {timeout} s after the signals")
                        signal_child(process, signal.SIGKILL)
                        await process.wait()
            outcome.served = outcome.served or _saw_it(name, kubelet, api)
    outcome.stderr = err.read_text(errors="replace")
    _judge(outcome, tmp)
    return outcome


async def until_main(pid: int, timeout: float) -> None:  # noqa: ASYNC109
    """Wait until the process catches SIGTERM (its main's first line took it over).

    Python catches only SIGINT on its own; the kernel shows the caught signals in
    /proc/PID/status (SigCgt, a hexadecimal mask, bit N-1 for signal N).
    """
    bit = 1 << (signal.SIGTERM - 1)

    def caught_or_gone() -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return True  # it ended already: judged as it is
        caught = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
        return bool(caught) and bool(int(caught[0], 16) & bit)

    # Not caught in time: the signals go anyway, and the outcome is judged as it is.
    with suppress(AssertionError):
        await wait_until(caught_or_gone, timeout=timeout, interval=0.002)


async def _served(name: str, kubelet: FakeKubelet, api: FakeKubeAPI, timeout: float) -> None:  # noqa: ASYNC109
    if name == "nvidia-dra":
        await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=timeout)
    else:
        resource = {"run": "example.com/widget", "fake": "example.com/fake"}.get(name, "nvidia.com/gpu")
        await kubelet.wait_for_registration(resource, timeout=timeout)


def _saw_it(name: str, kubelet: FakeKubelet, api: FakeKubeAPI) -> bool:
    if name == "nvidia-dra":
        return bool(api.slices(node=NODE, driver=DRIVER))
    return any(r.accepted for r in kubelet.registrations)


def _judge(outcome: Outcome, tmp: Path) -> None:
    sent = len(outcome.burst.signals) + (outcome.moment == "shutdown")
    lines = outcome.stderr.splitlines()
    if outcome.status == 130:
        if outcome.served:
            outcome.problems.append("status 130 after it had served")
        if not any(line.endswith(": interrupted") for line in lines):
            outcome.problems.append("status 130 without the 'interrupted' line")
    elif outcome.status not in (0, None):
        outcome.problems.append(f"status {outcome.status}")
    if "Traceback" in outcome.stderr:
        outcome.problems.append("a traceback on stderr")
    about = [line for line in lines if "signal_received" in line or line.endswith(": interrupted")]
    if len(about) > sent:
        outcome.problems.append(f"{len(about)} lines about {sent} signal(s)")
    left = _leftovers(outcome.command, tmp)
    if left:
        outcome.problems.append(f"left behind: {', '.join(left)}")


def describe(outcomes: Sequence[Outcome]) -> str:
    """The failed trials, one paragraph each, with the end of their stderr."""
    return "\n\n".join(
        f"{o.command} at {o.moment} with {o.burst.label()}: status {o.status}: {'; '.join(o.problems)}\n"
        + "\n".join(o.stderr.splitlines()[-8:])
        for o in outcomes
        if o.problems
    )
