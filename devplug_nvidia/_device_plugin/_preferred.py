"""Preferred allocation for NVIDIA devices: pure functions of the request and start-up facts.

* Full GPUs (no replicas): the set with the highest sum of pairwise link scores
  (:func:`devplug.policies.topology_score`, exact branch and bound) over the :class:`LinkMatrix`
  read at start-up. Without a matrix, the fewest NUMA nodes.
* Replicas (``<id>::<n>``) and MIG devices: upstream's greedy policy (nvidia.md §4), per physical
  GPU: ``distributed`` takes from the GPU with the fewest replicas in use, ``packed`` from the one
  with the most, ties broken by how many this request already took from it, then, unlike
  upstream's unstable heap, by the order the kubelet listed the devices.

Every function returns a valid answer (the must-include IDs, then picks, ``size`` in all) and
never raises: an error from GetPreferredAllocation fails the pod's admission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import structlog

from devplug import policies
from devplug_nvidia._container._allocate import strip_replica

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from devplug_nvidia._gpu._links import LinkMatrix
    from devplug_nvidia._gpu._model import GpuRecord

__all__ = ["SharedPolicy", "greedy_replicas", "physical_gpu", "preferred", "preferred_gpus"]

log = structlog.get_logger(__name__)

SharedPolicy = Literal["distributed", "packed"]
"""How replicas and MIG devices are placed (``--shared-devices-allocation-policy``)."""


def physical_gpu(device_id: str, records_by_id: Mapping[str, GpuRecord]) -> str:
    """The physical GPU a device ID lives on: the parent's UUID for a MIG device or a replica of
    one, the GPU's UUID otherwise; the ID itself (replica suffix cut) when no record is known."""
    real = strip_replica(device_id)
    record = records_by_id.get(real)
    if record is None:
        return real
    return record.mig.parent_uuid if record.mig is not None else record.uuid


def preferred(
    available_ids: Sequence[str],
    must_include_ids: Sequence[str],
    size: int,
    *,
    records_by_id: Mapping[str, GpuRecord],
    links: LinkMatrix | None,
    policy: SharedPolicy = "distributed",
    advertised_ids: Collection[str] | None = None,
) -> list[str]:
    """The devices to prefer for a request of ``size`` devices (what the plugin's hook returns).

    Args:
        available_ids: the IDs the kubelet offers, in its order (replica IDs included).
        must_include_ids: the IDs the answer must contain.
        size: how many devices the container asks for.
        records_by_id: the plugin's records by listed ID (without replica suffix).
        links: the link matrix from start-up; None: no topology known (NUMA is used).
        policy: the shared-devices policy for replicas and MIG devices.
        advertised_ids: every ID the plugin lists (all replicas), for counting what is in use
            per GPU; default: only the offered ones, so nothing counts as in use.
    """
    try:
        if _aligned(available_ids, records_by_id):
            return preferred_gpus(
                available_ids, must_include_ids, size, records_by_id=records_by_id, links=links
            )
        return greedy_replicas(
            available_ids,
            must_include_ids,
            size,
            records_by_id=records_by_id,
            policy=policy,
            advertised_ids=advertised_ids,
        )
    except Exception as exc:  # the policies guard themselves; this guards the dispatch
        log.exception("preferred_allocation_failed", error=str(exc), size=size)
        return policies.first_available(list(available_ids), list(must_include_ids), size)


def _aligned(available_ids: Sequence[str], records_by_id: Mapping[str, GpuRecord]) -> bool:
    """Upstream aligns only full GPUs without replicas; everything else goes greedy."""
    for device_id in available_ids:
        if "::" in device_id:
            return False
        record = records_by_id.get(device_id)
        if record is not None and record.kind != "gpu":
            return False
    return True


def preferred_gpus(
    available_ids: Sequence[str],
    must_include_ids: Sequence[str],
    size: int,
    *,
    records_by_id: Mapping[str, GpuRecord],
    links: LinkMatrix | None,
) -> list[str]:
    """Full GPUs: the best-linked set (exact) over ``links``; the fewest NUMA nodes without it."""
    if links is None:
        numa = {i: r.numa_node for i, r in records_by_id.items()}
        return policies.numa_aligned(available_ids, must_include_ids, size, numa=numa)
    uuid_of = {i: r.uuid for i, r in records_by_id.items()}

    def score(a: str, b: str) -> float:
        ua, ub = uuid_of.get(a), uuid_of.get(b)
        return 0.0 if ua is None or ub is None else float(links.score(ua, ub))

    return policies.topology_score(available_ids, must_include_ids, size, scores=score)


def greedy_replicas(
    available_ids: Sequence[str],
    must_include_ids: Sequence[str],
    size: int,
    *,
    records_by_id: Mapping[str, GpuRecord],
    policy: SharedPolicy = "distributed",
    advertised_ids: Collection[str] | None = None,
) -> list[str]:
    """Replicas and MIG devices: upstream's greedy distributed / packed choice, deterministic.

    In use per physical GPU = its advertised IDs minus its offered IDs (must-include ones count as in
    use, as upstream counts them); each pick updates the counts.
    """
    ids = list(dict.fromkeys(available_ids))
    offered = set(ids)
    must = [m for m in dict.fromkeys(must_include_ids) if m in offered]
    needed = size - len(must)
    if needed <= 0 or size >= len(ids):
        return policies.repair((), ids, must, size)
    chosen = set(must)
    candidates = [i for i in ids if i not in chosen]
    gpu_of = {i: physical_gpu(i, records_by_id) for i in (*ids, *(advertised_ids or ()))}
    queues: dict[str, list[str]] = {}
    for device_id in candidates:
        queues.setdefault(gpu_of[device_id], []).append(device_id)
    total = dict.fromkeys(queues, 0)
    for device_id in dict.fromkeys(advertised_ids if advertised_ids is not None else ids):
        gpu = gpu_of[device_id]
        if gpu in total:
            total[gpu] += 1
    for gpu, queue in queues.items():
        # Advertised lists that miss offered IDs would make counts negative; never below the queue.
        total[gpu] = max(total[gpu], len(queue))
    order = {gpu: n for n, gpu in enumerate(queues)}
    picked_from = dict.fromkeys(queues, 0)
    for m in must:
        if gpu_of[m] in picked_from:
            picked_from[gpu_of[m]] += 1
    sign = -1 if policy == "packed" else 1  # packed: the most used GPU first
    if policy not in ("distributed", "packed"):
        log.warning("unknown_shared_policy", policy=policy, using="distributed")

    def rank(gpu: str) -> tuple[int, int, int]:
        in_use = total[gpu] - len(queues[gpu])
        return (sign * in_use, picked_from[gpu], order[gpu])

    picks: list[str] = []
    for _ in range(needed):
        gpu = min((g for g in queues if queues[g]), key=rank)
        picks.append(queues[gpu].pop(0))
        picked_from[gpu] += 1
    return policies.repair([*must, *picks], ids, must, size)
