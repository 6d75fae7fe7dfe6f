"""Capped, jittered exponential back-off that never gives up."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays of ``initial * 2**n`` capped at ``maximum``, each drawn from [50 %, 100 %] of that.

    The jitter keeps many plugins on one node (or many nodes after a fleet-wide kubelet
    upgrade) from retrying in lock-step.
    """

    initial: float = 0.05
    maximum: float = 10.0
    attempts: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** min(self.attempts, 32))
        self.attempts += 1
        return ceiling * self._rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempts = 0
