"""The rules every allocation policy keeps, checked by hypothesis, and hand-worked examples."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from devplug import Device, policies

Policy = Callable[[Sequence[str], Sequence[str], int], list[str]]

GPUS = [f"g{i}" for i in range(8)]
CARD = {g: i // 2 for i, g in enumerate(GPUS)}  # two GPUs per card


# -- worked examples ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("must", "size", "expected"),
    [
        ([], 2, ["g0", "g1"]),  # one whole card
        ([], 3, ["g0", "g1", "g2"]),  # a whole card, then one more
        (["g2"], 2, ["g2", "g3"]),  # the must-include's card is completed first
        (["g2", "g5"], 4, ["g2", "g5", "g3", "g4"]),  # both partly used cards completed
        (["g7"], 3, ["g7", "g0", "g6"]),  # its card, then a new one (kubelet order after must)
    ],
)
def test_packed_examples(must: list[str], size: int, expected: list[str]) -> None:
    assert policies.packed(GPUS, must, size, key=CARD) == expected


def test_packed_best_fit_keeps_big_groups_whole() -> None:
    # Groups: a has 3 free, b has 1, c has 2. One device: b (fits exactly); two: c; four: a + b.
    group = {"a0": "a", "a1": "a", "a2": "a", "b0": "b", "c0": "c", "c1": "c"}
    ids = list(group)
    assert policies.packed(ids, [], 1, key=group) == ["b0"]
    assert policies.packed(ids, [], 2, key=group) == ["c0", "c1"]
    assert policies.packed(ids, [], 4, key=group) == ["a0", "a1", "a2", "b0"]


@pytest.mark.parametrize(
    ("must", "size", "expected"),
    [
        ([], 2, ["g0", "g2"]),
        ([], 4, ["g0", "g2", "g4", "g6"]),  # one per card
        ([], 5, ["g0", "g1", "g2", "g4", "g6"]),  # then a second on the first card
        (["g0"], 3, ["g0", "g2", "g4"]),  # the must-include's card counts as used
        (["g0", "g2"], 3, ["g0", "g2", "g4"]),
    ],
)
def test_spread_examples(must: list[str], size: int, expected: list[str]) -> None:
    assert policies.spread(GPUS, must, size, key=CARD) == expected


def test_none_key_is_a_group_of_its_own() -> None:
    ids = ["x", "y", "z"]
    assert policies.spread(ids, [], 2, key={"x": 1, "y": 1}) == ["x", "z"]  # z alone: own group
    assert policies.packed(ids, [], 2, key={"x": 1, "y": 1}) == ["x", "y"]


NUMA_DEVICES = [
    Device(id="n0a", numa_node=0),
    Device(id="n1a", numa_node=1),
    Device(id="n0b", numa_node=0),
    Device(id="n1b", numa_node=1),
    Device(id="n1c", numa_node=1),
    Device(id="free"),  # no affinity: fits any node set
]


@pytest.mark.parametrize(
    ("must", "size", "expected"),
    [
        ([], 2, ["n0a", "n0b"]),  # node 0 and node 1 both fit; node 0 (with "free") fits best
        ([], 3, ["n0a", "n0b", "free"]),  # node 0 plus the device without affinity
        ([], 4, ["n1a", "n1b", "n1c", "free"]),  # only node 1 holds four
        (["n1a"], 2, ["n1a", "n1b"]),  # node 1 is in use: pack into it
        (["n0a", "n1a"], 4, ["n0a", "n1a", "n0b", "n1b"]),  # both in use: the fuller first
    ],
)
def test_numa_aligned_examples(must: list[str], size: int, expected: list[str]) -> None:
    by_id = {d.id: d for d in NUMA_DEVICES}
    assert policies.numa_aligned(NUMA_DEVICES, [by_id[m] for m in must], size) == expected


def test_numa_aligned_from_ids_and_a_mapping() -> None:
    numa = {"a": 0, "b": [1], "c": None, "d": -1, "e": 1}
    assert policies.numa_aligned(list(numa), [], 2, numa=numa) == ["c", "d"]
    assert policies.numa_aligned(list(numa), ["a"], 2, numa=numa) == ["a", "c"]
    assert policies.numa_aligned(list(numa), ["b"], 3, numa=numa) == ["b", "c", "e"]
    # IDs without facts: no affinity at all, so the first ones.
    assert policies.numa_aligned(["p", "q", "r"], [], 2) == ["p", "q"]


def test_policies_take_devices_from_the_hook() -> None:
    devices = [Device(id=g) for g in GPUS]
    assert policies.packed(devices, [devices[3]], 2, key=CARD) == ["g3", "g2"]
    assert policies.first_available(devices, [], 2) == ["g0", "g1"]


# -- the invariants, for every policy ----------------------------------------------------------


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[str], list[str], int, dict[str, int | None]]:
    ids = draw(st.lists(st.sampled_from([f"d{i}" for i in range(12)]), unique=True, min_size=1, max_size=10))
    must = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
    size = draw(st.integers(min_value=len(must), max_value=len(ids) + 2))
    facts = {i: draw(st.none() | st.integers(0, 3)) for i in ids}
    return ids, must, size, facts


def policy_set(facts: dict[str, int | None]) -> dict[str, Policy]:
    devices = {i: Device(id=i, numa_node=n) for i, n in facts.items()}
    weights = {a: {b: float(int(a[1:]) * int(b[1:]) % 5 - 1) for b in facts} for a in facts}

    def numa_devices(a: Sequence[str], m: Sequence[str], n: int) -> list[str]:
        return policies.numa_aligned([devices[i] for i in a], [devices[i] for i in m], n)

    return {
        "first": policies.first_available,
        "packed": lambda a, m, n: policies.packed(a, m, n, key=facts),
        "spread": lambda a, m, n: policies.spread(a, m, n, key=facts.get),
        "numa": lambda a, m, n: policies.numa_aligned(a, m, n, numa=facts),
        "numa-devices": numa_devices,
        "topology": lambda a, m, n: policies.topology_score(a, m, n, scores=weights),
        "topology-greedy": lambda a, m, n: policies.topology_score(a, m, n, scores=weights, exact_limit=2),
    }


@settings(max_examples=300)
@given(instances())
def test_every_policy_keeps_the_rules(
    instance: tuple[list[str], list[str], int, dict[str, int | None]],
) -> None:
    ids, must, size, facts = instance
    for name, policy in policy_set(facts).items():
        result = policy(ids, must, size)
        assert len(result) == min(size, len(ids)), name
        assert len(set(result)) == len(result), name
        assert set(must) <= set(result) <= set(ids), name
        if size >= len(ids):
            assert set(result) == set(ids), name
        assert policy(ids, must, size) == result, name  # deterministic


def groups_used(chosen: Sequence[str], facts: dict[str, int | None]) -> int:
    return len({facts[i] if facts[i] is not None else ("own", i) for i in chosen})


def all_choices(ids: list[str], must: list[str], size: int) -> list[tuple[str, ...]]:
    free = [i for i in ids if i not in must]
    return [(*must, *c) for c in combinations(free, size - len(must))]


@settings(max_examples=200)
@given(instances())
def test_packed_spread_and_numa_are_optimal(
    instance: tuple[list[str], list[str], int, dict[str, int | None]],
) -> None:
    ids, must, size, facts = instance
    if size > len(ids):
        return
    choices = all_choices(ids, must, size)
    fewest = min(groups_used(c, facts) for c in choices)
    most = max(groups_used(c, facts) for c in choices)
    assert groups_used(policies.packed(ids, must, size, key=facts), facts) == fewest
    assert groups_used(policies.spread(ids, must, size, key=facts), facts) == most

    def nodes(chosen: Sequence[str]) -> int:
        return len({facts[i] for i in chosen if facts[i] is not None})

    assert nodes(policies.numa_aligned(ids, must, size, numa=facts)) == min(nodes(c) for c in choices)


# -- never raising -----------------------------------------------------------------------------


def boom(*args: object) -> Hashable:
    raise RuntimeError("no facts today")


@pytest.mark.parametrize(
    "policy",
    [
        lambda a, m, n: policies.packed(a, m, n, key=boom),
        lambda a, m, n: policies.spread(a, m, n, key=lambda i: [i]),  # unhashable
        lambda a, m, n: policies.numa_aligned(a, m, n, numa=boom),
        lambda a, m, n: policies.numa_aligned(a, m, n, numa=lambda i: "not nodes"),
        lambda a, m, n: policies.topology_score(a, m, n, scores=boom),
        lambda a, m, n: policies.topology_score(a, m, n, scores={"g0": {"g1": float("nan")}}),
        lambda a, m, n: policies.topology_score(a, m, n, scores={"g0": {"g1": "high"}}),
    ],
    ids=["key-raises", "key-unhashable", "numa-raises", "numa-garbage", "scores-raise", "nan", "text"],
)
def test_a_broken_fact_falls_back_to_a_valid_choice(policy: Policy) -> None:
    with capture_logs() as logs:
        result = policy(GPUS, ["g5"], 3)
    assert result == ["g5", "g0", "g1"]
    assert [e["event"] for e in logs] == ["policy_failed"]


def test_odd_requests_are_repaired_not_refused() -> None:
    assert policies.packed(GPUS, ["g1", "g2"], 1, key=CARD) == ["g1", "g2"]  # must-include wins
    assert policies.spread(GPUS, [], 0, key=CARD) == []
    assert policies.packed(["a", "a", "b"], ["zz"], 1, key={}) == ["a"]  # duplicates, unknown
    assert policies.spread(GPUS, [], 20, key=CARD) == GPUS
