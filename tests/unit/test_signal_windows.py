"""The narrow windows of devplug's stop signals, each forced at its worst moment in a child
process: a signal between the two handlers being set, and a stop signal whose Interrupted
Python swallowed (raised inside a finalizer)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(body: str) -> subprocess.CompletedProcess[str]:
    script = "import os, signal, sys\nfrom devplug._runtime import signals\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_sigint_while_the_handlers_are_set_is_one_line_not_a_keyboard_interrupt() -> None:
    # SIGINT arrives right after the first handler is set: with one handler set and the other
    # not, it met Python's own handler (a KeyboardInterrupt traceback, death by SIGINT).
    result = run_script(
        """
        real = signal.signal
        def set_then_interrupt(signum, handler):
            previous = real(signum, handler)
            os.kill(os.getpid(), signal.SIGINT)
            return previous
        signal.signal = set_then_interrupt
        signals.install_signals("probe")
        print("not interrupted")
        """
    )
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "probe: interrupted\n")


def test_a_stop_signal_swallowed_on_its_way_still_stops_the_start() -> None:
    # The Interrupted of the first signal is raised inside a finalizer, where Python prints
    # "Exception ignored" and goes on, and later signals are ignored: the process used to
    # serve on with no signal able to stop it.
    result = run_script(
        """
        import gc
        import anyio
        signals.install_signals("probe")

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs in here, and its exception is lost
                    pass

        Finalized()
        gc.collect()
        print("went on", flush=True)

        async def serve():
            print("served", flush=True)
            await anyio.sleep(30)

        signals.run_async(serve)
        """
    )
    assert result.returncode == 130
    assert result.stdout == "went on\n"
    assert "Exception ignored" in result.stderr
    assert result.stderr.count("probe: interrupted") == 1
