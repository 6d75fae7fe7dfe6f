"""SIGTERM / SIGINT at fixed moments of each command's life: exit 0 (130 before serving), no
traceback, one log line per signal at most, nothing left behind (see signal_kit).

The moments: 0.15 s (inside main, loading the library), 0.4 s and 0.8 s (settings, discovery,
the start of the runner, depending on the command and the machine's load), right after the
fake kubelet or API server saw it, and during shutdown (a SIGTERM, then the burst 5 ms later).
A signal before ``main``'s first line (the interpreter starting) ends the process the default
way, so a moment is never earlier than that line (signal_kit waits for it under load).
scripts/signal_stress.py runs random moments, many times.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.signal_kit import BURSTS, Moment, describe, trial

pytestmark = pytest.mark.anyio

CASES = [
    ("run", 0.15, "term"),
    ("run", 0.4, "int+int-group"),
    ("run", "registered", "term+term"),
    ("run", "shutdown", "term+int+term+int+term"),
    ("fake", 0.4, "term+term"),
    ("fake", "registered", "int+int-group"),
    ("fake", "shutdown", "term+term"),
    ("nvidia", 0.4, "term+int+term+int+term"),
    ("nvidia", 0.8, "int"),
    ("nvidia", "registered", "term+term"),
    ("nvidia", "shutdown", "int+int-group"),
    ("nvidia-dra", 0.8, "term+term"),
    ("nvidia-dra", "registered", "int+int-group"),
    ("nvidia-dra", "shutdown", "term+int+term+int+term"),
]


@pytest.mark.parametrize(("command", "moment", "burst"), CASES, ids=str)
async def test_signals_end_it_cleanly(short_dir: Path, command: str, moment: Moment, burst: str) -> None:
    outcome = await trial(command, moment, BURSTS[burst], short_dir)
    assert not outcome.problems, describe([outcome])
    if moment in ("registered", "shutdown"):
        assert outcome.status == 0
    else:
        assert outcome.status in (0, 130)
