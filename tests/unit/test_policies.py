from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from devplug.policies import first_available, repair


def test_first_available_examples() -> None:
    assert first_available(["a", "b", "c", "d"], [], 2) == ["a", "b"]
    assert first_available(["a", "b", "c", "d"], ["c"], 2) == ["c", "a"]
    assert first_available(["a", "b"], [], 5) == ["a", "b"]
    assert first_available(["a", "b"], [], 0) == []


def test_repair_keeps_valid_choice_and_fixes_invalid() -> None:
    avail = ["a", "b", "c", "d"]
    assert repair(["d", "b"], avail, [], 2) == ["d", "b"]
    assert repair(["x", "d", "d"], avail, [], 2) == ["d", "a"]  # unknown and duplicate dropped, filled
    assert repair(["a", "b", "c"], avail, ["d"], 2) == ["d", "a"]  # must-include first, cut to size
    assert repair([], avail, ["b", "c", "d"], 2) == ["b", "c", "d"]  # must-include is never dropped


ids = st.lists(st.sampled_from([f"d{i}" for i in range(12)]), unique=True, min_size=1)


@given(data=st.data(), available=ids)
def test_repair_invariants(data: st.DataObject, available: list[str]) -> None:
    must = data.draw(st.lists(st.sampled_from(available), unique=True))
    size = data.draw(st.integers(min_value=len(must), max_value=len(available)))
    choice = data.draw(st.lists(st.sampled_from([*available, "zz"])))
    result = repair(choice, available, must, size)
    assert len(result) == size
    assert len(set(result)) == len(result)
    assert set(must) <= set(result) <= set(available)
    assert result == repair(choice, available, must, size)  # deterministic
