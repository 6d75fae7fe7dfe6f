"""topology_score: exact optimum (against brute force), worked NVLink examples, greedy fallback."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from devplug import policies

# Two quads of fully linked GPUs (score 2 per link), and one weaker link (score 1) from each
# GPU to its twin in the other quad: the shape of a hybrid cube mesh.
GPUS = [f"g{i}" for i in range(8)]


def mesh_score(a: str, b: str) -> float:
    i, j = int(a[1:]), int(b[1:])
    if i // 4 == j // 4:
        return 2.0
    return 1.0 if abs(i - j) == 4 else 0.0


def value(chosen: list[str] | tuple[str, ...], score: dict[tuple[str, str], float]) -> float:
    return sum(score.get((a, b), score.get((b, a), 0.0)) for a, b in combinations(chosen, 2))


@pytest.mark.parametrize(
    ("must", "size", "expected"),
    [
        ([], 2, ["g0", "g1"]),  # any linked pair in a quad; the earliest wins ties
        ([], 4, ["g0", "g1", "g2", "g3"]),  # a whole quad: 6 links of 2
        ([], 5, ["g0", "g1", "g2", "g3", "g4"]),  # the quad plus a twin (12 + 1)
        (["g5"], 2, ["g5", "g4"]),  # the quad-mate (2) beats the twin (1)
        (["g0", "g4"], 3, ["g0", "g4", "g1"]),  # g1 and g5 both add 2: the earlier wins
        # g3 is g0's quad-mate (2) and g7's twin (1), g1 links to g0 and g3 (2 + 2): 7 in all.
        (["g0", "g7"], 4, ["g0", "g7", "g1", "g3"]),
    ],
)
def test_mesh_examples(must: list[str], size: int, expected: list[str]) -> None:
    assert policies.topology_score(GPUS, must, size, scores=mesh_score) == expected


def test_score_matrix_as_a_mapping_with_one_direction() -> None:
    scores = {"a": {"b": 1.0, "c": 5.0}, "d": {"c": 4.0}}
    assert policies.topology_score(["a", "b", "c", "d"], [], 2, scores=scores) == ["a", "c"]
    assert policies.topology_score(["a", "b", "c", "d"], ["d"], 2, scores=scores) == ["d", "c"]
    assert policies.topology_score(["a", "b", "c", "d"], [], 3, scores=scores) == ["a", "c", "d"]


def test_greedy_past_the_size_limit_says_so() -> None:
    with capture_logs() as logs:
        result = policies.topology_score(GPUS, [], 4, scores=mesh_score, exact_limit=6)
    assert len(result) == 4
    assert [e["event"] for e in logs] == ["topology_score_greedy"]
    assert logs[0]["reason"] == "instance_too_large"


def test_negative_scores_are_avoided() -> None:
    # b and c repel each other: the best three leave one of them out.
    scores = {"b": {"c": -10.0}, "a": {"b": 1.0, "c": 1.0}}
    assert policies.topology_score(["a", "b", "c", "d"], [], 3, scores=scores) == ["a", "b", "d"]


@st.composite
def scored_instances(
    draw: st.DrawFn,
) -> tuple[list[str], list[str], int, dict[tuple[str, str], float]]:
    n = draw(st.integers(min_value=1, max_value=9))
    ids = [f"d{i}" for i in range(n)]
    must = draw(st.lists(st.sampled_from(ids), unique=True, max_size=n))
    size = draw(st.integers(min_value=len(must), max_value=n))
    values = st.integers(-3, 9).map(float) | st.floats(-5, 20, allow_nan=False, allow_infinity=False)
    score = {(a, b): draw(values) for a, b in combinations(ids, 2)}
    return ids, must, size, score


def brute_force_best(
    ids: list[str], must: list[str], size: int, score: dict[tuple[str, str], float]
) -> float:
    free = [i for i in ids if i not in must]
    return max(value((*must, *rest), score) for rest in combinations(free, size - len(must)))


@settings(max_examples=400, deadline=None)
@given(scored_instances())
def test_matches_brute_force(
    instance: tuple[list[str], list[str], int, dict[tuple[str, str], float]],
) -> None:
    ids, must, size, score = instance
    matrix: dict[str, dict[str, float]] = {}
    for (a, b), s in score.items():
        matrix.setdefault(a, {})[b] = s
    result = policies.topology_score(ids, must, size, scores=matrix)
    assert len(result) == size and set(must) <= set(result)
    best = brute_force_best(ids, must, size, score)
    assert value(result, score) == pytest.approx(best, rel=1e-9, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=10, max_value=16), st.data())
def test_matches_brute_force_on_bigger_instances(n: int, data: st.DataObject) -> None:
    ids = [f"d{i}" for i in range(n)]
    r = data.draw(st.randoms(use_true_random=False))
    score = {(a, b): float(r.randint(0, 10)) for a, b in combinations(ids, 2)}
    size = data.draw(st.integers(min_value=2, max_value=min(n - 1, 6)))
    result = policies.topology_score(ids, [], size, scores=lambda a, b: score[(a, b)])
    assert value(result, score) == brute_force_best(ids, [], size, score)
