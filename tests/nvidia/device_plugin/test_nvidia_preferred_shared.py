"""Preferred allocation for replicas and MIG devices: upstream's greedy policy, made deterministic."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplug_nvidia._device_plugin._preferred import SharedPolicy, greedy_replicas, physical_gpu, preferred
from devplug_nvidia._gpu._model import GpuRecord
from devplug_nvidia._gpu._nvml import Nvml
from devplug_nvidia.discovery import MigStrategy, apply_mig_strategy, discover_devices
from devplug_nvidia.testing import fake_nvml
from tests.nvidia.nvidia_upstream import greedy_outcomes

REPLICAS = 4


@cache
def _records(model: str, strategy: MigStrategy = "none") -> dict[str, list[GpuRecord]]:
    with Nvml.open(fake_nvml(model)) as nvml:
        records = discover_devices(nvml, sysfs="/nonexistent", proc="/nonexistent")
    return apply_mig_strategy(records, strategy)


def _replicated(model: str) -> tuple[dict[str, GpuRecord], list[str]]:
    gpus = _records(model)["nvidia.com/gpu"]
    return {g.uuid: g for g in gpus}, [f"{g.uuid}::{n}" for g in gpus for n in range(REPLICAS)]


def _gpus_of(ids: list[str], by_id: dict[str, GpuRecord]) -> Counter[str]:
    return Counter(physical_gpu(i, by_id) for i in ids)


def test_distributed_spreads_and_packed_packs() -> None:
    by_id, advertised = _replicated("dgx-a100")
    u = list(by_id)
    spread = preferred(advertised, [], 8, records_by_id=by_id, links=None, advertised_ids=advertised)
    assert _gpus_of(spread, by_id) == Counter(dict.fromkeys(u, 1))
    packed = preferred(
        advertised, [], 6, records_by_id=by_id, links=None, policy="packed", advertised_ids=advertised
    )
    assert _gpus_of(packed, by_id) == Counter({u[0]: 4, u[1]: 2})


def test_replicas_in_use_steer_the_choice() -> None:
    by_id, advertised = _replicated("pcie-a10")
    u = list(by_id)
    # GPU 0 has three replicas in use, GPU 1 one, GPUs 2 and 3 none.
    available = [a for a in advertised if a not in {f"{u[0]}::0", f"{u[0]}::1", f"{u[0]}::2", f"{u[1]}::0"}]
    spread = greedy_replicas(available, [], 3, records_by_id=by_id, advertised_ids=advertised)
    assert _gpus_of(spread, by_id) == Counter({u[2]: 1, u[3]: 1, u[1]: 1})
    packed = greedy_replicas(
        available, [], 2, records_by_id=by_id, policy="packed", advertised_ids=advertised
    )
    assert _gpus_of(packed, by_id) == Counter({u[0]: 1, u[1]: 1})


def test_must_include_comes_first_and_counts_as_picked() -> None:
    by_id, advertised = _replicated("pcie-a10")
    u = list(by_id)
    must = [f"{u[3]}::2"]
    chosen = greedy_replicas(advertised, must, 4, records_by_id=by_id, advertised_ids=advertised)
    assert chosen[0] == must[0]
    # Upstream counts the must-include replica as in use on GPU 3, so it goes there last.
    assert _gpus_of(chosen, by_id) == Counter(dict.fromkeys(u, 1))


def test_mig_devices_spread_over_parent_gpus() -> None:
    migs = _records("mig-uniform", "single")["nvidia.com/gpu"]
    by_id = {m.uuid: m for m in migs}
    ids = list(by_id)
    chosen = preferred(ids, [], 4, records_by_id=by_id, links=None)
    parents = Counter(physical_gpu(c, by_id) for c in chosen)
    assert sorted(parents.values()) == [2, 2]
    assert {by_id[c].kind for c in chosen} == {"mig"}
    packed = preferred(ids, [], 4, records_by_id=by_id, links=None, policy="packed")
    assert len({physical_gpu(c, by_id) for c in packed}) == 1


def test_deterministic_in_the_kubelets_order() -> None:
    by_id, advertised = _replicated("dgx-h100")
    first = greedy_replicas(advertised, [], 5, records_by_id=by_id, advertised_ids=advertised)
    assert first == greedy_replicas(advertised, [], 5, records_by_id=by_id, advertised_ids=advertised)
    assert first == [f"{u}::0" for u in list(by_id)[:5]]


def test_never_fails() -> None:
    by_id, advertised = _replicated("pcie-a10")
    # More asked than offered, unknown IDs, must-include outside the offer, an unknown policy.
    assert len(greedy_replicas(advertised[:3], [], 10, records_by_id=by_id)) == 3
    chosen = greedy_replicas(["x::0", "x::1", "y::0"], ["z::0"], 2, records_by_id={}, policy="odd")  # type: ignore[arg-type]
    assert chosen == ["x::0", "y::0"]
    assert greedy_replicas(advertised, [], 0, records_by_id=by_id) == []


@pytest.mark.parametrize("policy", ["distributed", "packed"])
@pytest.mark.parametrize("model", ["dgx-a100", "pcie-a10", "mig-mixed"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_one_of_upstreams_answers(policy: SharedPolicy, model: str, data: st.DataObject) -> None:
    """Upstream's heap breaks ties arbitrarily; our answer is one it could give, and valid."""
    by_id, advertised = _replicated(model)
    available = data.draw(st.lists(st.sampled_from(advertised), min_size=1, max_size=16, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
    size = data.draw(st.integers(min_value=max(1, len(must)), max_value=len(available)))
    chosen = greedy_replicas(
        available,
        must,
        size,
        records_by_id=by_id,
        policy=policy,
        advertised_ids=advertised,
    )
    assert len(chosen) == size == len(set(chosen))
    assert chosen[: len(must)] == must
    assert set(chosen) <= set(available)
    totals = _gpus_of(advertised, by_id)
    outcomes = greedy_outcomes(
        available, must, size, gpu_of=lambda i: physical_gpu(i, by_id), totals=totals, policy=policy
    )
    picks = _gpus_of(chosen[len(must) :], by_id)
    assert frozenset(picks.items()) in outcomes
