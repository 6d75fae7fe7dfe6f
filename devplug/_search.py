"""The maximum-weight k-subset search behind :func:`devplug.policies.topology_score`.

Choose ``picks`` of ``n`` items maximising ``sum(linear[i]) + sum(weights[i][j])`` over the
chosen items and pairs (``linear`` carries each item's links to the must-include devices).
Depth-first branch and bound over items in a fixed order, seeded with the best greedy answer:

* an item's *gain* is its linear term plus its weights to the items already chosen;
* with ``t`` picks left from the items at positions ``>= s``, an item ``j`` can add at most
  ``gain[j] + 0.5 * (its t-1 largest weights to items at positions >= s)``, because each pair
  among the new items is counted from both ends; the ``t`` largest of those bounds, added to
  the value so far, bound every completion;
* a branch whose bound cannot beat the best answer found is cut.

Items are ordered by their potential (linear term plus largest weights), so good answers come
early and cut the most. Plain lists and floats only: no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import nlargest

__all__ = ["SearchResult", "best_subset", "greedy", "subset_value"]

# A search visiting more nodes than this stops with its best answer so far (not proven best).
NODE_BUDGET = 5_000


@dataclass(frozen=True)
class SearchResult:
    indices: tuple[int, ...]
    """The chosen items, in increasing order."""
    value: float
    exact: bool
    """False when the node budget ran out before the answer was proven best."""


class _BudgetExhausted(Exception):
    pass


def subset_value(weights: list[list[float]], linear: list[float], indices: tuple[int, ...]) -> float:
    """The objective of one subset (used by tests and the greedy seed)."""
    total = sum(linear[i] for i in indices)
    for a, i in enumerate(indices):
        row = weights[i]
        total += sum(row[j] for j in indices[a + 1 :])
    return total


def greedy(weights: list[list[float]], linear: list[float], picks: int) -> list[int]:
    """The best of several greedy answers: from no seed, and from each single item as the seed.

    Each step adds the item of largest gain (lowest index on ties).
    """
    n = len(weights)
    best: tuple[float, list[int]] | None = None
    for seed in (None, *range(n)):
        chosen: list[int] = []
        gains = list(linear)
        value = 0.0
        while len(chosen) < picks:
            pick = seed if seed is not None and not chosen else None
            if pick is None:
                taken = set(chosen)
                pick = max((j for j in range(n) if j not in taken), key=lambda j: (gains[j], -j))
            value += gains[pick]
            chosen.append(pick)
            row = weights[pick]
            gains = [g + w for g, w in zip(gains, row, strict=True)]
        if best is None or value > best[0]:
            best = (value, sorted(chosen))
    assert best is not None
    return best[1]


def best_subset(
    weights: list[list[float]], linear: list[float], picks: int, node_budget: int = NODE_BUDGET
) -> SearchResult:
    """The subset of ``picks`` items with the largest objective (exact unless the budget runs out)."""
    n = len(weights)
    if picks <= 0 or picks >= n:
        chosen = tuple(range(n)) if picks >= n else ()
        return SearchResult(chosen, subset_value(weights, linear, chosen), exact=True)
    seed = tuple(greedy(weights, linear, picks))
    # Reorder by potential: the items most likely in the answer first.
    potential = [
        linear[j] + sum(nlargest(picks - 1, (w for i, w in enumerate(weights[j]) if i != j)))
        for j in range(n)
    ]
    order = sorted(range(n), key=lambda j: (-potential[j], j))
    w = [[weights[a][b] for b in order] for a in order]
    lin = [linear[a] for a in order]
    # half[s][t][j]: half the sum of the t largest weights of j to items at positions >= s.
    half = [[[0.0] * n for _ in range(picks)] for _ in range(n + 1)]
    for s in range(n):
        for j in range(n):
            row = sorted((w[j][i] for i in range(s, n) if i != j), reverse=True)
            acc = 0.0
            for t in range(1, picks):
                if t <= len(row):
                    acc += row[t - 1]
                half[s][t][j] = 0.5 * acc
    state = _State(w, half, subset_value(weights, linear, seed), node_budget)
    exact = True
    try:
        state.dfs(0, picks, 0.0, lin, ())
    except _BudgetExhausted:
        exact = False
    if state.best_set is None:
        return SearchResult(seed, state.best, exact)
    chosen = tuple(sorted(order[i] for i in state.best_set))
    return SearchResult(chosen, subset_value(weights, linear, chosen), exact)


class _State:
    def __init__(self, w: list[list[float]], half: list[list[list[float]]], best: float, budget: int) -> None:
        self.w = w
        self.half = half
        self.n = len(w)
        self.best = best
        # Only an answer better by more than rounding noise replaces the greedy seed.
        self.eps = 1e-9 * (1.0 + abs(best))
        self.best_set: tuple[int, ...] | None = None
        self.budget = budget

    def dfs(self, start: int, left: int, value: float, gains: list[float], chosen: tuple[int, ...]) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise _BudgetExhausted
        n = self.n
        if left == 1:
            j = max(range(start, n), key=lambda j: (gains[j], -j))
            if value + gains[j] > self.best + self.eps:
                self.best = value + gains[j]
                self.eps = 1e-9 * (1.0 + abs(self.best))
                self.best_set = (*chosen, j)
            return
        t = left - 1
        for i in range(start, n - left + 1):
            row = self.w[i]
            child = [g + x for g, x in zip(gains, row, strict=True)]
            half = self.half[i + 1][t - 1]
            bound = value + gains[i] + sum(nlargest(t, [child[j] + half[j] for j in range(i + 1, n)]))
            if bound > self.best + self.eps:
                self.dfs(i + 1, t, value + gains[i], child, (*chosen, i))
