"""The kubelet's DRA rules and error texts (``pkg/kubelet/cm/dra``), as pure functions.

No I/O and no gRPC here. The texts are the kubelet's, word for word, so that a driver's tests
can match on them; where the fake adds a check of its own, its text says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devplug.testing._kubelet.validation import go_quote

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug.testing._kubelet.dra_resource import ClaimLike, ClaimResult

DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""``servicesSupportedByKubelet`` of kubelet >= 1.34, most recent first."""
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"

PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"


def go_quote_list(values: Sequence[str]) -> str:
    """A ``[]string`` printed with Go's ``%q``: ``["a" "b"]``."""
    return "[" + " ".join(go_quote(v) for v in values) + "]"


def choose_service(services: Sequence[str]) -> tuple[str | None, str | None]:
    """The DRAPlugin service kubelet >= 1.34 uses: the first of the plugin's list it knows.

    The plugin's order decides, not the kubelet's preference, so a plugin listing
    ``v1beta1.DRAPlugin`` before ``v1.DRAPlugin`` is called on v1beta1.

    Returns:
        ``(service, None)``, or ``(None, problem)`` with the kubelet's text.
    """
    if not services:
        return None, "empty list of supported gRPC services (aka supported versions)"
    for service in services:
        if service in DRA_SERVICES:
            return service, None
    return None, (
        f"none of services supported by the plugin ({go_quote_list(services)}) "
        f"are supported by the kubelet ({go_quote_list(DRA_SERVICES)})"
    )


def validate_dra_plugin(driver: str, endpoint: str, services: Sequence[str]) -> tuple[str | None, str | None]:
    """``ValidatePlugin`` of the DRA plugin manager: only the service list is checked (not the name).

    Returns:
        ``(service, None)``, or ``(None, error)`` with the kubelet's text.
    """
    service, problem = choose_service(services)
    if problem is not None:
        plugin = f"DRA driver plugin {driver} at endpoint {endpoint}"
        return None, f"invalid supported gRPC versions of {plugin}: {problem}"
    return service, None


def endpoint_taken_error(driver: str, endpoint: str) -> str:
    """The kubelet's text when a second instance registers an endpoint already in use (>= 1.34)."""
    return f"endpoint {endpoint} already registered for DRA driver plugin {driver}"


def not_registered_error(driver: str) -> str:
    """``GetPlugin``'s text for a driver without any registered instance."""
    if not driver:
        return "DRA driver name is empty"
    return f"DRA driver {driver} is not registered"


def health_service(services: Sequence[str]) -> str | None:
    """The health service the kubelet opens: the newest one the plugin advertises, else none.

    Kubelet 1.37 prefers ``v1.DRAResourceHealth``, takes ``v1alpha1`` when only that is
    advertised, and opens no health stream for a plugin that advertises neither. (Kubelets
    1.34-1.36 opened v1alpha1 whether advertised or not, retrying every 5 s when it was not
    served: kubernetes issue 141855.)
    """
    for service in (HEALTH_V1, HEALTH_V1ALPHA1):
        if service in services:
            return service
    return None


def check_prepare(claims: Sequence[ClaimLike], answered: Mapping[str, ClaimResult]) -> str | None:
    """The kubelet's checks on a NodePrepareResources answer (``prepareResources``).

    Returns:
        The first problem, in the kubelet's words (without the "prepare dynamic resources: "
        prefix), or ``None``.
    """
    names = {uid: name for _, name, uid in claims}
    # The kubelet walks the answer's map in Go's random order, so with several problems any of
    # them may be the one reported; this fake reports them in UID order, the same every time.
    for uid, result in sorted(answered.items()):
        if uid not in names:
            return f"{PREPARE} returned result for unknown claim UID {uid}"
        if result.error:
            return f"{PREPARE} failed for ResourceClaim {names[uid]}: {result.error}"
        for device in result.devices:
            # Not checked by the kubelet, which stores the device as it comes; without both
            # names its health and status lookups by (pool, device) can never match.
            if not device.pool or not device.device:
                return (
                    f"{PREPARE} returned a device without pool_name or device_name for ResourceClaim "
                    f"{names[uid]} (fake kubelet: both are required by the protocol)"
                )
    return _skipped(PREPARE, claims, answered)


def check_unprepare(claims: Sequence[ClaimLike], answered: Mapping[str, str]) -> str | None:
    """The kubelet's checks on a NodeUnprepareResources answer (``unprepareResources``)."""
    names = {uid: name for _, name, uid in claims}
    for uid, error in sorted(answered.items()):
        if uid not in names:
            return f"{UNPREPARE} returned result for unknown claim UID {uid}"
        if error:
            return f"{UNPREPARE} failed for ResourceClaim {names[uid]}: {error}"
    return _skipped(UNPREPARE, claims, answered)


def _skipped(method: str, claims: Sequence[ClaimLike], answered: Mapping[str, object]) -> str | None:
    # The kubelet counts, it does not compare: the request minus the answers.
    unfinished = len(claims) - len(answered)
    if unfinished != 0:
        return f"{method} skipped {unfinished} ResourceClaims"
    return None
