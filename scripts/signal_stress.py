"""Random SIGTERM / SIGINT bursts at random moments of each command's life, many times.

    .venv/bin/python scripts/signal_stress.py [TRIES_PER_COMMAND] [SEED]

Each try picks a command (devplug run, devplug-fake, devplug-nvidia --fake-nvml dgx-a100 as a
device plugin and as a DRA driver), a burst (tests/chaos/signal_kit.py BURSTS) and a moment:
a random time from 0.1 s to 1.5 s after the start, or once registered, or during shutdown.
Prints every failed try and the totals per command; exits 1 if any try failed.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.signal_kit import BURSTS, COMMANDS, Moment, describe, trial


async def main(tries: int, seed: int) -> int:
    rng = random.Random(seed)  # noqa: S311 - reproducible, not secret
    failed = 0
    for command in COMMANDS:
        bad = 0
        for _ in range(tries):
            moment: Moment = rng.choice(["registered", "shutdown", round(rng.uniform(0.1, 1.5), 3)])
            burst = BURSTS[rng.choice(sorted(BURSTS))]
            with tempfile.TemporaryDirectory(prefix="dps-", dir="/tmp") as tmp:
                outcome = await trial(command, moment, burst, Path(tmp), timeout=20)
            if outcome.problems:
                bad += 1
                print(describe([outcome]), flush=True)
        print(f"{command}: {tries} tries, {bad} failed (seed {seed})", flush=True)
        failed += bad
    return 1 if failed else 0


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else random.randrange(1 << 30)  # noqa: S311
    sys.exit(anyio.run(main, count, seed))
