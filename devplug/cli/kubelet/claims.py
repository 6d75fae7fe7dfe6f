"""``devplug kubelet --dra`` as the scheduler and the kubelet of the claims in its API server.

A real cluster allocates a ResourceClaim when a pod that uses it is scheduled, and the node's
kubelet prepares it before the pod starts; there are no pods here, so every claim stands for
one. A claim without an allocation is allocated on the node as the scheduler would
(:meth:`~devplug.testing.FakeKubeAPI.allocate_claim`: first fit, or the devices named in its
``devplug.dev/devices`` annotation), for the driver its first request's device class names
(the kit's convention: the class is named after its driver), or the only driver publishing on
the node when no driver is named so; then the kubelet prepares it (NodePrepareResources) and
a deleted claim is unprepared. Each step is a line on the terminal, and its outcome an
annotation of the claim (``kubelet.devplug.dev/prepared``: the CDI device IDs, or
``kubelet.devplug.dev/error``), which ``devplug claim`` waits for.

A claim is looked at again only when it changes (a new resourceVersion): one that could not be
allocated stays so until it is applied again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

    from devplug.testing import FakeKubeAPI, FakeKubelet

DEVICES = "devplug.dev/devices"
"""Annotation: the devices to allocate, comma-separated (instead of the scheduler's first fit)."""
PREPARED = "kubelet.devplug.dev/prepared"
"""Annotation the kubelet writes: the claim's CDI device IDs, comma-separated, once prepared."""
ERROR = "kubelet.devplug.dev/error"
"""Annotation the kubelet writes: why the claim could not be allocated or prepared."""

Ref = tuple[str, str, str]
"""A claim: namespace, name, UID."""


async def follow_claims(api: FakeKubeAPI, kubelet: FakeKubelet, node: str, out: TextIO) -> None:
    """Allocate, prepare and unprepare the API server's claims as they come and go, for ever."""

    def say(out: TextIO, line: str) -> None:
        print(line, file=out, flush=True)

    prepared: dict[str, tuple[str, Ref]] = {}  # UID → (driver, the claim)
    seen: dict[str, str] = {}  # UID → the resourceVersion acted on last
    while True:

        def changed(seen: dict[str, str] = seen) -> bool:
            return _versions(api) != seen

        try:
            await api.wait_for(changed, timeout=3600)
        except TimeoutError:
            continue
        claims = {c["metadata"]["uid"]: c for c in api.claims()}
        for uid in sorted(prepared.keys() - claims.keys()):
            driver, ref = prepared.pop(uid)
            say(out, await _unprepare(kubelet, driver, ref))
        for uid in seen.keys() - claims.keys():
            del seen[uid]
        for uid, claim in claims.items():
            if seen.get(uid) == claim["metadata"]["resourceVersion"]:
                continue
            done = await _act(
                api, kubelet, claim, node=node, prepared=prepared, tell=lambda line: say(out, line)
            )
            seen[uid] = done["metadata"]["resourceVersion"]


def _versions(api: FakeKubeAPI) -> dict[str, str]:
    return {c["metadata"]["uid"]: c["metadata"]["resourceVersion"] for c in api.claims()}


async def _act(
    api: FakeKubeAPI,
    kubelet: FakeKubelet,
    claim: dict[str, Any],
    *,
    node: str,
    prepared: dict[str, tuple[str, Ref]],
    tell: Callable[[str], None],
) -> dict[str, Any]:
    """Allocate and prepare one claim as far as it goes; the claim as last written."""
    from devplug.errors import KubeletError
    from devplug.testing import AllocationError

    meta = claim["metadata"]
    ref: Ref = (meta["namespace"], meta["name"], meta["uid"])
    what = f"claim {ref[0]}/{ref[1]}"
    if meta["uid"] in prepared:
        return claim
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is None:
        driver, problem = _driver(api, node, claim)
        wanted = [d.strip() for d in (meta.get("annotations") or {}).get(DEVICES, "").split(",") if d.strip()]
        if driver is not None:
            try:
                claim = api.allocate_claim(ref[0], ref[1], node=node, driver=driver, devices=wanted or None)
            except AllocationError as exc:
                problem = str(exc)
        if problem is not None:
            tell(f"{what} not allocated: {problem}")
            return api.annotate_claim(ref[0], ref[1], {ERROR: f"not allocated: {problem}"})
        allocation = claim["status"]["allocation"]
    results = allocation["devices"]["results"]
    tell(f"{what} allocated on {node}: {', '.join(_device(r) for r in results)}")
    if not (claim.get("status") or {}).get("reservedFor"):
        return claim  # no pod uses it: a kubelet has nothing to prepare
    driver = results[0]["driver"] if results else ""
    try:
        answer = await kubelet.prepare(driver, [ref])
    except KubeletError as exc:
        tell(f"{what} not prepared: {exc}")
        return api.annotate_claim(ref[0], ref[1], {ERROR: f"not prepared: {exc}"})
    prepared[ref[2]] = (driver, ref)
    ids = [i for device in answer[ref[2]].devices for i in device.cdi_device_ids]
    tell(f"{what} prepared by {driver}: CDI devices {', '.join(ids) or 'none'}")
    return api.annotate_claim(ref[0], ref[1], {PREPARED: ",".join(ids)})


def _driver(api: FakeKubeAPI, node: str, claim: dict[str, Any]) -> tuple[str | None, str | None]:
    """The driver to allocate the claim from, or why there is none."""
    drivers = sorted({str(s["spec"]["driver"]) for s in api.slices(node=node)})
    requests = claim["spec"]["devices"].get("requests") or [{}]
    named = (requests[0].get("exactly") or {}).get("deviceClassName")
    if named in drivers:
        return named, None
    if len(drivers) == 1:
        return drivers[0], None
    if not drivers:
        return None, f"no driver publishes devices on node {node} yet"
    return None, (
        f"device class {named!r} names none of the drivers publishing on node {node} ({', '.join(drivers)})"
    )


async def _unprepare(kubelet: FakeKubelet, driver: str, ref: Ref) -> str:
    from devplug.errors import KubeletError

    what = f"claim {ref[0]}/{ref[1]}"
    try:
        await kubelet.unprepare(driver, [ref])
    except KubeletError as exc:
        return f"{what} deleted; not unprepared: {exc}"
    return f"{what} deleted; unprepared by {driver}"


def _device(result: dict[str, Any]) -> str:
    return f"{result['driver']} {result['pool']}/{result['device']}"
