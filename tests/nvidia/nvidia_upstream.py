"""Reference models of upstream's allocation, written from nvidia.md §4 and §6, for comparisons.

* :func:`upstream_nvlinks`: NVLinks counted as upstream counts them (enabled links whose remote
  PCI bus ID is the other GPU's), which finds none through NVSwitches.
* :func:`best_effort`: go-gpuallocator's best-effort policy by brute force: every partition of
  the available GPUs (padded) into sets of ``size``, the best-scoring partition that has a set
  holding all required GPUs, then the best such set in it.
* :func:`greedy_outcomes`: every answer upstream's greedy replica policy can give (its heap is
  unstable, so ties may go any way), as multisets of physical GPUs.
* :func:`optimum`: the best set by exhaustive search.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from itertools import combinations

from devplug.topology import normalize_pci_bus_id
from devplug_nvidia._gpu._links import LinkMatrix
from devplug_nvidia.testing import MODELS, FakeNvml, MachineModel

Score = Callable[[str, str], int]


def upstream_nvlinks(fake: FakeNvml) -> dict[frozenset[str], int]:
    """Pair of GPU UUIDs → NVLinks found by comparing each link's remote bus ID with the peer's."""
    gpus = fake.model.gpus
    counts: dict[frozenset[str], int] = {}
    for i, j in combinations(range(len(gpus)), 2):
        peer = normalize_pci_bus_id(gpus[j].bus_id)
        links = gpus[i].nvlinks or ()
        found = sum(1 for link in links if link.active and normalize_pci_bus_id(link.remote_bus_id) == peer)
        counts[frozenset((fake.model.gpu_uuid(i), fake.model.gpu_uuid(j)))] = found
    return counts


def upstream_view(fake: FakeNvml) -> LinkMatrix:
    """The matrix upstream would score with: the same PCIe levels, NVLinks counted its way."""
    model = fake.model
    uuids = tuple(model.gpu_uuid(i) for i in range(len(model.gpus)))
    levels = {
        frozenset((uuids[i], uuids[j])): model.levels[i][j] for i, j in combinations(range(len(uuids)), 2)
    }
    nvlinks = {pair: n for pair, n in upstream_nvlinks(fake).items() if n}
    return LinkMatrix(gpus=uuids, levels=levels, nvlinks=nvlinks)


def degraded_dgx_a100() -> MachineModel:
    """A DGX A100 whose GPU 5 lost its links to three of its six NVSwitches (6 links left)."""
    base = MODELS["dgx-a100"]
    gpu5 = base.gpus[5]
    assert gpu5.nvlinks is not None
    links = tuple(replace(link, active=False) if n < 6 else link for n, link in enumerate(gpu5.nvlinks))
    gpus = tuple(replace(g, nvlinks=links) if i == 5 else g for i, g in enumerate(base.gpus))
    return replace(base, name="dgx-a100-degraded", gpus=gpus)


def set_score(devices: Sequence[str | None], score: Score) -> int:
    return sum(score(a, b) for a, b in combinations(devices, 2) if a is not None and b is not None)


def _partitions(devices: list[str | None], size: int, padding: int) -> Iterator[list[list[str | None]]]:
    """Partitions into sets of ``size``, each set led by the first remaining device (no repeats);
    a set holds either no padding or all of it."""
    if len(devices) == size:
        yield [devices]
        return
    head, rest = devices[0], devices[1:]
    for others in combinations(rest, size - 1):
        group = [head, *others]
        pads = sum(1 for d in group if d is None)
        if pads not in (0, padding):
            continue
        remaining = list(rest)
        for d in others:
            remaining.remove(d)
        for tail in _partitions(remaining, size, padding):
            yield [group, *tail]


def best_effort(available: Sequence[str], required: Sequence[str], size: int, score: Score) -> list[str]:
    """go-gpuallocator's best-effort choice ([] where it gives none)."""
    if size <= 0 or len(available) < size or len(required) > size:
        return []
    need = set(required)

    def holds(group: Sequence[str | None]) -> bool:
        return need <= set(group) and None not in group

    if size == 1:
        partitions: Iterator[list[list[str | None]]] = iter([[[d]] for d in available])
    else:
        padded: list[str | None] = list(available)
        while len(padded) % size:
            padded.append(None)
        partitions = _partitions(padded, size, len(padded) - len(available))
    best: list[list[str | None]] | None = None
    best_score = 0
    for partition in partitions:
        if not any(holds(g) for g in partition):
            continue
        total = sum(set_score(g, score) for g in partition)
        if best is None or total > best_score:
            best, best_score = partition, total
    if best is None:
        return []
    candidates = [g for g in best if need <= set(g)]
    chosen = candidates[0]
    for group in candidates[1:]:
        if set_score(group, score) > set_score(chosen, score):
            chosen = group
    return [d for d in chosen if d is not None]


def optimum(available: Sequence[str], required: Sequence[str], size: int, score: Score) -> int:
    """The best set score over every valid choice."""
    rest = [a for a in available if a not in required]
    picks = min(size, len(available)) - len(required)
    return max(set_score([*required, *c], score) for c in combinations(rest, picks))


def greedy_outcomes(
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    *,
    gpu_of: Callable[[str], str],
    totals: Counter[str],
    policy: str,
) -> set[frozenset[tuple[str, int]]]:
    """Every multiset of physical GPUs upstream's greedy policy may pick (ties in any order)."""
    candidates = [a for a in available if a not in required]
    remaining = Counter(gpu_of(c) for c in candidates)
    picked = Counter(gpu_of(r) for r in required if gpu_of(r) in remaining)
    needed = size - len(required)
    gpus = sorted(remaining)

    def key(gpu: str, left: Counter[str], picked_from: Counter[str]) -> tuple[int, int]:
        in_use = totals[gpu] - left[gpu]
        return (in_use if policy == "distributed" else -in_use, picked_from[gpu])

    # Breadth first over (taken per GPU) states: the remaining and picked-from counts follow from them.
    states = {tuple(0 for _ in gpus)}
    for _ in range(needed):
        following: set[tuple[int, ...]] = set()
        for taken in states:
            left = Counter({g: remaining[g] - t for g, t in zip(gpus, taken, strict=True)})
            picked_from = Counter({g: picked[g] + t for g, t in zip(gpus, taken, strict=True)})
            live = [g for g in gpus if left[g] > 0]
            best = min(key(g, left, picked_from) for g in live)
            for n, gpu in enumerate(gpus):
                if left[gpu] > 0 and key(gpu, left, picked_from) == best:
                    following.add(tuple(t + (i == n) for i, t in enumerate(taken)))
        states = following
    return {frozenset((g, t) for g, t in zip(gpus, taken, strict=True) if t) for taken in states}
