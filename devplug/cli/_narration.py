"""The demos' narration: timed steps, details, and state-file writes (no devplug runtime here)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from pathlib import Path
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
