"""The demos' narration: timed steps, details, and state-file writes (of the devplug runtime only
the signal handling, which ends a demo on Ctrl-C or SIGTERM)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

if sys.version_info < (3, 11):  # anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

from devplug._runtime.signals import run_async
from devplug.logging import configure as configure_logging

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import TextIO


class Narrator:
    """Prints the demo's steps with their time since the start, and paces them for a reader."""

    def __init__(self, out: TextIO, pace: float) -> None:
        self.out = out
        self.pace = pace
        self.color = out.isatty() and "NO_COLOR" not in os.environ
        self.started = time.monotonic()

    async def pause(self) -> None:
        """Give a person watching time to read the last step (timings are taken before it)."""
        await anyio.sleep(self.pace)

    def _paint(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def step(self, text: str) -> None:
        clock = self._paint("2", f"{time.monotonic() - self.started:6.2f}s")
        print(f"{clock} {self._paint('32', '✓')} {text}", file=self.out, flush=True)

    def detail(self, text: str) -> None:
        for line in text.splitlines():
            print(f"          {self._paint('2', line)}", file=self.out, flush=True)


def write_state(path: Path, devices: list[dict[str, object]]) -> None:
    # Write a new file and rename it into place, the way a careful writer updates state.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    os.replace(tmp, path)


def tell(
    story: Callable[[Path, TextIO, float], Awaitable[None]],
    *,
    name: str,
    out: TextIO | None,
    pace: float | None,
    over: str,
) -> int:
    """Run ``story(workdir, out, pace)`` in a temporary directory that is removed at the end.

    ``pace``: seconds to pause after the main steps; default 0.8 on a terminal, 0 otherwise.
    Returns 0, or 1 with the failure and the end of ``plugin.log`` on stderr.

    Raises:
        SystemExit: status 130 on SIGINT or SIGTERM (with one line on stderr), once the story
            has been cancelled, its plugin stopped and the directory removed.
    """
    stream = out or sys.stdout
    if pace is None:
        pace = 0.8 if stream.isatty() else 0.0
    # The fakes log what they do; the narration says it better here.
    configure_logging("console", "warning")
    workdir = Path(tempfile.mkdtemp(prefix="devplug-demo-"))
    try:
        run_async(lambda: story(workdir, stream, pace))
    except Exception as exc:
        print(f"{name} failed: {_reason(exc)}", file=sys.stderr)
        log = workdir / "plugin.log"
        if log.exists():
            sys.stderr.write(log.read_text()[-4000:])
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"done: everything above ran over {over}; nothing was left behind.", file=stream)
    return 0


def _reason(exc: BaseException) -> BaseException:
    """The failure itself, out of the task groups (the plugin's, the fakes') it came through."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
