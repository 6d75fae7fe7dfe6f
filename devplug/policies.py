"""Preferred-allocation policies: pure functions of (available, must-include, size, device facts).

Use one from a plugin's ``preferred_allocation`` hook in one line::

    async def preferred_allocation(self, available, must_include, size):
        return policies.numa_aligned(available, must_include, size)

Every policy takes the available and must-include devices as IDs or as :class:`~devplug.Device`
objects (whose ``numa_nodes`` then serve as facts), and:

* returns exactly ``size`` IDs (all available ones when fewer exist), every must-include ID
  among them, all drawn from the available set;
* returns the whole available set at once when that is what was asked for;
* is deterministic: the same input gives the same output;
* never raises: a failing key function or score matrix is logged and a valid choice returned,
  because an error from GetPreferredAllocation fails the pod's admission.

Device facts come as a *key* (``Callable[[id], Hashable]`` or a mapping from ID): devices with
the same key share a group (a physical card, a PCI function, a NUMA node); a key of ``None``
makes a device a group of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from itertools import combinations
from typing import TypeAlias

import structlog

from devplug import _search
from devplug.models import Device

__all__ = [
    "Candidates",
    "GroupKey",
    "NumaFacts",
    "Scores",
    "first_available",
    "numa_aligned",
    "packed",
    "repair",
    "spread",
    "topology_score",
]

log = structlog.get_logger("devplug.policies")

Candidates: TypeAlias = Sequence[str] | Sequence[Device]
"""Devices as the kubelet lists them: their IDs, or the :class:`Device` objects of the hook."""
GroupKey: TypeAlias = Callable[[str], Hashable | None] | Mapping[str, Hashable | None]
"""The group of a device ID (card, PCI function, ...); ``None`` or absent: a group of its own."""
_Nodes: TypeAlias = Iterable[int] | int | None
NumaFacts: TypeAlias = Callable[[str], _Nodes] | Mapping[str, _Nodes]
"""The NUMA node(s) of a device ID; ``None``, ``-1`` or empty: no NUMA affinity."""
Scores: TypeAlias = Callable[[str, str], float] | Mapping[str, Mapping[str, float]]
"""The link score of a pair of device IDs (higher is better); a missing pair scores 0."""

# A choice function gets the deduplicated available IDs, the must-include IDs that are
# available, and the number of further IDs to pick (0 < picks < free IDs); it returns the picks.
_Choose = Callable[[list[str], list[str], int], Iterable[str]]

# Past this many free devices topology_score searches greedily instead of exactly: the exact
# search is exponential in the worst case, and GetPreferredAllocation must answer fast.
EXACT_LIMIT = 24


def first_available(available: Candidates, must_include: Candidates, size: int) -> list[str]:
    """The must-include IDs, then the available ones in the kubelet's order, up to ``size``."""
    return repair((), _ids(available), _ids(must_include), size)


def repair(
    choice: Iterable[str], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """Make ``choice`` valid: must-include first, then chosen IDs that are available, then fill.

    IDs not in ``available`` and duplicates are dropped; the result is cut or filled (in
    ``available`` order) to ``size``. Must-include IDs are kept even past ``size`` because the
    kubelet asked for them.
    """
    allowed = dict.fromkeys(available)
    result = dict.fromkeys(m for m in must_include if m in allowed)
    for source in (choice, available):
        for device_id in source:
            if len(result) >= size:
                return list(result)
            if device_id in allowed:
                result.setdefault(device_id)
    return list(result)


def packed(available: Candidates, must_include: Candidates, size: int, *, key: GroupKey) -> list[str]:
    """Fill as few groups as possible, leaving the other groups whole for later requests.

    Groups the must-include devices already use are filled first (the fullest first); then the
    fewest new groups are opened, largest first, and the last one is the smallest group that
    fits the remainder (best fit).

    Args:
        available: the devices the kubelet offers (IDs or :class:`Device` objects).
        must_include: the devices the choice must contain.
        size: how many devices to choose in all.
        key: the group of each device ID.
    """
    group = _key_function(key)
    return _guarded("packed", available, must_include, size, lambda a, m, n: _pack(a, m, n, group))


def spread(available: Candidates, must_include: Candidates, size: int, *, key: GroupKey) -> list[str]:
    """Use as many groups as possible, evenly: each pick comes from the least used group.

    Counts include the must-include devices; ties go to the group seen first in ``available``.

    Args:
        available: the devices the kubelet offers (IDs or :class:`Device` objects).
        must_include: the devices the choice must contain.
        size: how many devices to choose in all.
        key: the group of each device ID.
    """
    group = _key_function(key)
    return _guarded("spread", available, must_include, size, lambda a, m, n: _spread(a, m, n, group))


def numa_aligned(
    available: Candidates, must_include: Candidates, size: int, *, numa: NumaFacts | None = None
) -> list[str]:
    """Span the fewest NUMA nodes, then pack within them (see :func:`packed`).

    Among node sets of the smallest size that hold enough devices, the one with the fewest
    spare devices wins (best fit). Devices without NUMA affinity fit any node set.

    Args:
        available: the devices the kubelet offers (IDs or :class:`Device` objects).
        must_include: the devices the choice must contain.
        size: how many devices to choose in all.
        numa: the NUMA node(s) of each device ID; default: the ``numa_nodes`` of the
            :class:`Device` objects passed (IDs alone then have no NUMA affinity).
    """
    nodes_of = _numa_function(numa, available, must_include)
    return _guarded("numa_aligned", available, must_include, size, lambda a, m, n: _numa(a, m, n, nodes_of))


def topology_score(
    available: Candidates,
    must_include: Candidates,
    size: int,
    *,
    scores: Scores,
    exact_limit: int = EXACT_LIMIT,
) -> list[str]:
    """Maximise the sum of pairwise link scores of the chosen devices (NVLink-aware placement).

    The optimum is exact (branch and bound seeded by a greedy choice) up to ``exact_limit``
    free devices; past that, or if the search runs too long, the greedy choice is returned and
    the fact logged. Ties go to the devices earlier in ``available``.

    Args:
        available: the devices the kubelet offers (IDs or :class:`Device` objects).
        must_include: the devices the choice must contain.
        size: how many devices to choose in all.
        scores: the link score of each pair, symmetric; a mapping may hold either direction.
            A callable is called once per pair, with the earlier of the two in ``available``
            first. Scores must be finite numbers.
        exact_limit: the most free devices searched exactly.
    """
    score = _score_function(scores)

    def choose(ids: list[str], must: list[str], picks: int) -> list[str]:
        chosen = set(must)
        free = [i for i in ids if i not in chosen]
        weights = [[0.0] * len(free) for _ in free]
        for (a, x), (b, y) in combinations(enumerate(free), 2):
            weights[a][b] = weights[b][a] = score(x, y)
        position = {i: n for n, i in enumerate(ids)}
        linear = [sum(score(*sorted((x, m), key=position.__getitem__)) for m in must) for x in free]
        if len(free) > exact_limit:
            log.info("topology_score_greedy", reason="instance_too_large", free=len(free), limit=exact_limit)
            return [free[i] for i in _search.greedy(weights, linear, picks)]
        result = _search.best_subset(weights, linear, picks)
        if not result.exact:
            log.warning("topology_score_greedy", reason="search_budget_exhausted", free=len(free))
        return [free[i] for i in result.indices]

    return _guarded("topology_score", available, must_include, size, choose)


# -- the shared guard ------------------------------------------------------------------------


def _ids(devices: Candidates | Iterable[object]) -> list[str]:
    """Device IDs, in order, without duplicates."""
    return list(dict.fromkeys(d.id if isinstance(d, Device) else str(d) for d in devices))


def _guarded(
    name: str, available: Candidates, must_include: Candidates, size: int, choose: _Choose
) -> list[str]:
    """Run ``choose`` on the cases that need a choice; repair and log anything else."""
    ids = _ids(available)
    allowed = set(ids)
    must = [m for m in _ids(must_include) if m in allowed]
    picks = size - len(must)
    if size >= len(ids) or picks <= 0:
        # Everything asked for, or nothing left to choose: no policy can do better.
        return repair((), ids, must, size)
    try:
        choice = list(choose(ids, must, picks))
    except Exception as exc:
        log.exception("policy_failed", policy=name, error=str(exc), size=size, must_include=must)
        return first_available(ids, must, size)
    result = repair(_in_order(ids, [*must, *choice]), ids, must, size)
    if set(result) != set(must) | set(choice):
        log.warning("policy_repaired", policy=name, returned=choice, sent=result)
    return result


def _in_order(ids: list[str], chosen: Iterable[str]) -> list[str]:
    """``chosen`` in the kubelet's order (must-include first is restored by repair)."""
    wanted = set(chosen)
    return [i for i in ids if i in wanted]


def _key_function(key: GroupKey) -> Callable[[str], Hashable | None]:
    if isinstance(key, Mapping):
        return key.get
    return key


def _numa_function(
    numa: NumaFacts | None, available: Candidates, must_include: Candidates
) -> Callable[[str], frozenset[int]]:
    if numa is None:
        facts: dict[str, tuple[int, ...]] = {
            d.id: d.numa_nodes for d in (*available, *must_include) if isinstance(d, Device)
        }
        return lambda i: frozenset(facts.get(i, ()))
    lookup = numa.get if isinstance(numa, Mapping) else numa

    def nodes_of(device_id: str) -> frozenset[int]:
        value = lookup(device_id)
        if value is None:
            return frozenset()
        if isinstance(value, int):
            return frozenset((value,)) if value >= 0 else frozenset()
        return frozenset(n for n in value if n >= 0)

    return nodes_of


def _score_function(scores: Scores) -> Callable[[str, str], float]:
    raw: Callable[[str, str], object] = scores if callable(scores) else _matrix_lookup(scores)

    def score(a: str, b: str) -> float:
        value = float(raw(a, b))  # type: ignore[arg-type]
        if not math.isfinite(value):
            raise ValueError(f"score of ({a}, {b}) is {value}, not a finite number")
        return value

    return score


def _matrix_lookup(matrix: Mapping[str, Mapping[str, float]]) -> Callable[[str, str], object]:
    def lookup(a: str, b: str) -> object:
        for x, y in ((a, b), (b, a)):
            row = matrix.get(x)
            if row is not None and y in row:
                return row[y]
        return 0.0

    return lookup


# -- packing and spreading -------------------------------------------------------------------


def _group_of(group: Callable[[str], Hashable | None]) -> Callable[[str], object]:
    """The group key as used internally: a device whose key is None is a group of its own."""

    def key(device_id: str) -> object:
        g = group(device_id)
        return ("single", device_id) if g is None else ("group", g)

    return key


def _free_groups(ids: list[str], must: list[str], key: Callable[[str], object]) -> dict[object, list[str]]:
    """The IDs not in ``must``, by group, groups in order of first appearance."""
    chosen = set(must)
    members: dict[object, list[str]] = {}
    for device_id in ids:
        if device_id not in chosen:
            members.setdefault(key(device_id), []).append(device_id)
    return members


def _pack(ids: list[str], must: list[str], picks: int, group: Callable[[str], Hashable | None]) -> list[str]:
    key = _group_of(group)
    members = _free_groups(ids, must, key)
    used = {key(m) for m in must}
    order = {g: n for n, g in enumerate(members)}
    result: list[str] = []
    # Used groups first: no new group is opened; the fullest goes first so partial groups close.
    for g in sorted((g for g in members if g in used), key=lambda g: (len(members[g]), order[g])):
        result += members[g][: picks - len(result)]
    spare = [g for g in members if g not in used]
    while len(result) < picks:
        need = picks - len(result)
        fitting = [g for g in spare if len(members[g]) >= need]
        if fitting:
            best = min(fitting, key=lambda g: (len(members[g]), order[g]))
        else:
            best = max(spare, key=lambda g: (len(members[g]), -order[g]))
        spare.remove(best)
        result += members[best][:need]
    return result


def _spread(
    ids: list[str], must: list[str], picks: int, group: Callable[[str], Hashable | None]
) -> list[str]:
    key = _group_of(group)
    members = _free_groups(ids, must, key)
    counts = dict.fromkeys(members, 0)
    for m in must:
        g = key(m)
        if g in counts:
            counts[g] += 1
    order = {g: n for n, g in enumerate(members)}
    queues = {g: list(reversed(m)) for g, m in members.items()}
    result: list[str] = []
    while len(result) < picks:
        g = min((g for g in queues if queues[g]), key=lambda g: (counts[g], order[g]))
        result.append(queues[g].pop())
        counts[g] += 1
    return result


# -- NUMA ------------------------------------------------------------------------------------

# How many candidate node sets numa_aligned compares before settling for a greedy one.
_NODE_SET_BUDGET = 4096


def _numa(
    ids: list[str], must: list[str], picks: int, nodes_of: Callable[[str], frozenset[int]]
) -> list[str]:
    chosen = set(must)
    free = [i for i in ids if i not in chosen]
    nodes = {i: nodes_of(i) for i in (*free, *must)}
    required = frozenset[int]().union(*(nodes[m] for m in must))
    extra = sorted(frozenset[int]().union(*nodes.values()) - required)

    def admitted(node_set: frozenset[int]) -> list[str]:
        return [i for i in free if nodes[i] <= node_set]

    best: tuple[int, tuple[int, ...]] | None = None
    examined = 0
    for k in range(len(extra) + 1):
        for combo in combinations(extra, k):
            examined += 1
            fits = len(admitted(required | frozenset(combo)))
            if fits >= picks and (best is None or fits < best[0]):
                best = (fits, combo)
            if examined > _NODE_SET_BUDGET:
                break
        if best is not None or examined > _NODE_SET_BUDGET:
            break
    if best is None:
        # Too many nodes to compare every set: add the nodes that admit the most devices.
        log.info("numa_aligned_greedy", nodes=len(extra) + len(required))
        node_set = required
        while len(admitted(node_set)) < picks:
            spare = [n for n in extra if n not in node_set]
            node_set |= {max(spare, key=lambda n: (len(admitted(node_set | {n})), -n))}
        best = (0, tuple(sorted(node_set - required)))
    inside = admitted(required | frozenset(best[1]))
    by_nodes = {i: tuple(sorted(nodes[i])) or None for i in ids}
    return _pack([*must, *inside], must, picks, by_nodes.get)
