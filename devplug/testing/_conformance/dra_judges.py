"""The DRA conformance checks: their names, and the verdicts on what a run recorded.

:data:`DRA_CHECKS` names every check of :func:`devplug.testing.run_dra_conformance`. As for
device plugins (:mod:`devplug.testing._conformance.judges`), the verdicts are pure functions returning
``(status, reason)``: one line saying what was seen and, for a failure, why the kubelet (or the
scheduler) cares.
"""

from __future__ import annotations

import os
from collections import Counter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from devplug._text import counted
from devplug.cdi import parse_qualified_name
from devplug.testing._kubeapi.names import driver_name
from devplug.testing._kubelet.dra_validation import DRA_SERVICES, HEALTH_V1, HEALTH_V1ALPHA1

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from devplug.testing._conformance.judges import Outcome
    from devplug.testing._kubelet.dra_resource import ClaimResult, DraRegistration

DRA_CHECKS: Mapping[str, str] = MappingProxyType({
    "dra_socket_first": "the DRA socket accepts connections when the registration socket appears",
    "get_info": "GetInfo answers within 1 s: type DRAPlugin, a valid driver name, an absolute endpoint",
    "versions": "v1.DRAPlugin listed first, v1beta1.DRAPlugin too, both answering an empty request",
    "slices_published": "complete, valid slices: nodeName, pool named after the node, Node owner",
    "prepare_allocated_claim": "an allocated claim prepares to its devices, with CDI IDs whose specs exist",
    "idempotent_prepare": "preparing again answers the same; a deleted CDI spec is written again",
    "unprepare_unknown_claim": "unpreparing a claim never prepared succeeds",
    "entry_per_claim": "one entry per requested claim in every answer, and no other",
    "shared_devices": "a shared device prepares a share for each of two claims, each naming its share",
    "both_apis": "serving both APIs: what one gives is withheld from the other within 1 s",
    "slices_restored_after_wipe": "the slices are back within 5 s after a kubelet restart deleted them",
    "health_full_list": "NodeWatchResources (when advertised) lists every published device",
    "sigterm_clean": "SIGTERM: exit status 0 within 2 s, sockets removed",
})  # fmt: skip
"""Every DRA check's name and what it demands, in report order."""

Device = tuple[str, str]
"""``(pool, device)``."""


def get_info(registration: DraRegistration, wanted: str | None) -> Outcome:
    """The accepted registration's GetInfo: the name and the endpoint (the type got it this far)."""
    problems = [str(e) for e in driver_name(registration.driver, "name")]
    if problems:
        return "fail", (
            f"driver name {registration.driver!r} is invalid ({problems[0]}): ResourceSlices and claim "
            "results carry it, and the API server refuses them"
        )
    if wanted is not None and registration.driver != wanted:
        return "fail", f"GetInfo names {registration.driver!r}, not {wanted!r}"
    if registration.endpoint == registration.socket:
        where = "the registration socket itself (empty endpoint)"
    elif not os.path.isabs(registration.endpoint):
        return "fail", f"endpoint {registration.endpoint!r} is relative: the kubelet dials unix:<endpoint>"
    else:
        where = registration.endpoint
    return "pass", f"DRAPlugin {registration.driver}, endpoint {where}"


def versions(services: Sequence[str], answers: Mapping[str, str | None]) -> Outcome:
    """``supported_versions`` and whether each advertised DRAPlugin service answered an empty request.

    Args:
        answers: per DRAPlugin service advertised, ``None`` when it answered ``{}``, else why not.
    """
    listed = [s for s in services if s in DRA_SERVICES]
    if not listed or listed[0] != DRA_SERVICES[0]:
        return "fail", (
            f"supported_versions {list(services)}: list v1.DRAPlugin first (kubelet >= 1.34 uses the "
            "first service it knows, and v1beta1 is deprecated)"
        )
    if DRA_SERVICES[1] not in listed:
        return (
            "fail",
            f"supported_versions {list(services)}: kubelets 1.32 and 1.33 speak only v1beta1.DRAPlugin",
        )
    for service, problem in answers.items():
        if problem is not None:
            return "fail", f"{service} advertised, but an empty NodePrepareResources {problem}"
    health = [s for s in services if s in (HEALTH_V1, HEALTH_V1ALPHA1)]
    extra = f"; health: {', '.join(health)}" if health else ""
    return "pass", f"{', '.join(listed)}, both answering an empty request with an empty map{extra}"


def slices_problem(slices: Sequence[dict[str, Any]], node: str, node_uid: str) -> str:
    """What is wrong with one driver's slices of ``node`` ("" when nothing is)."""
    if not slices:
        return "no ResourceSlice for this node"
    pools: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        problem = _slice_problem(s, node, node_uid)
        if problem:
            return problem
        pools.setdefault(s["spec"]["pool"]["name"], []).append(s)
    return next((p for p in (_pool_problem(pool, members) for pool, members in pools.items()) if p), "")


def _slice_problem(s: dict[str, Any], node: str, node_uid: str) -> str:
    spec, name = s["spec"], s["metadata"]["name"]
    if spec.get("nodeName") != node:
        return f"{name}: spec.nodeName is {spec.get('nodeName')!r}, not {node!r}"
    if spec["pool"]["name"] != node:
        return f"{name}: pool {spec['pool']['name']!r} is not named after the node {node!r}"
    owners = s["metadata"].get("ownerReferences") or []
    if not any(o.get("kind") == "Node" and o.get("uid") == node_uid for o in owners):
        return f"{name}: no ownerReference to the Node (uid {node_uid}): nothing deletes it with the node"
    return ""


def _pool_problem(pool: str, members: list[dict[str, Any]]) -> str:
    generation = max(s["spec"]["pool"]["generation"] for s in members)
    current = [s for s in members if s["spec"]["pool"]["generation"] == generation]
    if len(current) != len(members):
        obsolete = counted(len(members) - len(current), "obsolete slice")
        return f"pool {pool}: {obsolete} below generation {generation}"
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in current}
    if counts != {len(current)}:
        return (
            f"pool {pool}: resourceSliceCount {sorted(counts)} for {counted(len(current), 'slice')}: "
            "the scheduler allocates nothing from an incomplete pool"
        )
    names = Counter(d["name"] for s in current for d in s["spec"].get("devices") or [])
    twice = sorted(n for n, c in names.items() if c > 1)
    if twice:
        return f"pool {pool}: device {twice[0]} listed twice: the pool is invalid for the scheduler"
    return ""


def published_devices(slices: Sequence[dict[str, Any]]) -> set[Device]:
    """Every ``(pool, device)`` of ``slices``."""
    return {(s["spec"]["pool"]["name"], d["name"]) for s in slices for d in s["spec"].get("devices") or []}


def prepared_problem(
    result: ClaimResult, allocated: Collection[Device], specs: Mapping[str, set[str]]
) -> str:
    """What is wrong with the answer for an allocated claim ("" when nothing is).

    Args:
        allocated: the ``(pool, device)`` pairs the scheduler allocated to this driver.
        specs: the CDI kinds found in the CDI directory and their device names.
    """
    returned = {(d.pool, d.device) for d in result.devices}
    missing = sorted(set(allocated) - returned)
    if missing:
        return f"allocated device {missing[0][0]}/{missing[0][1]} not in the answer"
    ids = [i for d in result.devices for i in d.cdi_device_ids]
    if not ids:
        return "no CDI device IDs: the containers would get nothing from the claim"
    for cdi_id in ids:
        problem = cdi_problem(cdi_id, specs)
        if problem:
            return problem
    return ""


def cdi_problem(cdi_id: str, specs: Mapping[str, set[str]]) -> str:
    """Whether ``cdi_id`` is fully qualified and a spec in the CDI directory defines it."""
    try:
        vendor, klass, name = parse_qualified_name(cdi_id)
    except ValueError as exc:
        return f"{exc} (the runtime cannot resolve it)"
    if name not in specs.get(f"{vendor}/{klass}", set()):
        return f"no CDI spec in the CDI directory defines {cdi_id}: the container would fail to start"
    return ""


def health_full_list(
    messages: Sequence[Collection[Device]], published: set[Device], error: str | None
) -> Outcome:
    """The last health message against the published devices."""
    if not messages:
        return "fail", f"no NodeWatchResources message (stream: {error or 'open, silent'})"
    missing = sorted(published - set(messages[-1]))
    if missing:
        return "fail", (
            f"the last message leaves out {len(missing)} of {len(published)} published devices "
            f"({missing[0][0]}/{missing[0][1]}, ...): each message must list all; the rest turn Unknown"
        )
    last = f"the last lists all {counted(len(published), 'published device')}"
    return "pass", f"{counted(len(messages), 'message')}; {last}"
