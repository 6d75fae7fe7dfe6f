"""topology_score timings: 8 and 16 devices, every allocation size, several score shapes.

    python bench/policies.py [--quick] [--out bench/results-policies.json]

Each sample is one call of ``devplug.policies.topology_score`` (the exact search), as the
servicer makes it, on a fresh score matrix: uniform random link scores (the hardest for the
search: little structure to cut on), sparse ones (most pairs unlinked), and an NVLink-like
mesh (fully linked groups of four, weak links between twins). Prints JSON with p50 / p99 / max
per device count and the worst size. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from itertools import combinations
from pathlib import Path
from typing import Any

from devplug import policies


def random_scores(ids: list[str], rng: random.Random, values: list[int]) -> dict[str, dict[str, float]]:
    matrix: dict[str, dict[str, float]] = {}
    for a, b in combinations(ids, 2):
        matrix.setdefault(a, {})[b] = float(rng.choice(values))
    return matrix


def mesh_scores(ids: list[str], rng: random.Random) -> dict[str, dict[str, float]]:
    del rng  # the mesh is fixed
    matrix: dict[str, dict[str, float]] = {}
    for (i, a), (j, b) in combinations(enumerate(ids), 2):
        same = i // 4 == j // 4
        matrix.setdefault(a, {})[b] = 2.0 if same else (1.0 if abs(i - j) == 4 else 0.0)
    return matrix


SHAPES = {
    "uniform": lambda ids, rng: random_scores(ids, rng, list(range(11))),
    "sparse": lambda ids, rng: random_scores(ids, rng, [0, 0, 0, 1, 2, 4]),
    "mesh": mesh_scores,
}


def summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1e3, 3)

    return {
        "unit": "ms",
        "runs": len(ordered),
        "p50": pct(50),
        "p99": pct(99),
        "max": round(ordered[-1] * 1e3, 3),
        "mean": round(statistics.fmean(ordered) * 1e3, 3),
    }


def bench(n: int, instances: int, seed: int) -> dict[str, Any]:
    ids = [f"gpu-{i}" for i in range(n)]
    rng = random.Random(seed)
    by_size: dict[int, list[float]] = {size: [] for size in range(1, n + 1)}
    by_shape: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for shape, make in SHAPES.items():
        for _ in range(instances if shape != "mesh" else 1):
            scores = make(ids, rng)
            for size, samples in by_size.items():
                start = time.perf_counter()
                policies.topology_score(ids, [], size, scores=scores)
                elapsed = time.perf_counter() - start
                samples.append(elapsed)
                by_shape[shape].append(elapsed)
    everything = [t for samples in by_size.values() for t in samples]
    worst = max(by_size, key=lambda size: max(by_size[size]))
    return {
        "devices": n,
        "all_sizes": summary(everything),
        "worst_size": {"size": worst, **summary(by_size[worst])},
        "by_shape": {shape: summary(samples) for shape, samples in by_shape.items()},
        "max_ms_by_size": {size: round(max(samples) * 1e3, 3) for size, samples in by_size.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer instances (a smoke test)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random score matrices")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    instances = 5 if args.quick else 100
    results = {
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "instances_per_shape": instances,
        "topology_score": [bench(n, instances, args.seed) for n in (8, 16)],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
