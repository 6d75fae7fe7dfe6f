"""RPC counters both services keep: requests, errors by status code, a latency histogram.

They cost a clock read, an addition and a bisect per call, so they are always on; the metrics
collectors read them at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

DURATION_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the RPC latency histogram: from a cached answer to a slow hook."""


class RpcStats:
    """Requests, errors by status code and a latency histogram of one RPC method."""

    __slots__ = ("buckets", "errors", "requests", "seconds")

    def __init__(self) -> None:
        self.requests = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # the last one: +Inf
        self.errors: Counter[str] = Counter()

    def observe(self, seconds: float) -> None:
        """One call that took ``seconds`` (counted whether it failed or not)."""
        self.requests += 1
        self.seconds += seconds
        self.buckets[bisect_left(DURATION_BUCKETS, seconds)] += 1

    def failed(self, code: str) -> None:
        self.errors[code] += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count) pairs as the exposition wants them, ending with +Inf."""
        total = 0
        out = []
        for bound, count in zip((*map(str, DURATION_BUCKETS), "+Inf"), self.buckets, strict=True):
            total += count
            out.append((bound, float(total)))
        return out
