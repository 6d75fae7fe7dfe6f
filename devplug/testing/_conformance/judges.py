"""The conformance checks: their names, and the verdicts on what the fake kubelet recorded.

:data:`CHECKS` names every check (:mod:`devplug.testing.conformance` re-exports it). The
verdicts are pure functions, no I/O: each takes the registrations or connections of a run and
returns ``(status, reason)``; the reason is one line naming what was seen, and for a failure,
why the kubelet cares.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from devplug._text import counted

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug.models import PluginOptions
    from devplug.testing._kubelet.resource import Endpoint, Registration

CheckStatus = Literal["pass", "fail", "skip"]

CHECKS: Mapping[str, str] = MappingProxyType({
    "serves_before_registering": "the socket accepts connections when Register arrives (the kubelet dials)",
    "valid_registration": "Register is accepted: v1beta1, an extended resource name, a bare file name",
    "consistent_options": "RegisterRequest.options equal GetDevicePluginOptions' reply",
    "initial_list_at_once": "every ListAndWatch stream gets the current list within 1 s of opening",
    "full_lists_only": "every message lists the same device IDs (nothing changed them), after restarts too",
    "exact_health_strings": 'health is exactly "Healthy" or "Unhealthy"',
    "allocate_one_response": "Allocate answers one container response for one container request",
    "unknown_ids_rejected": "Allocate of an unknown device ID fails with an error status",
    "preferred_allocation": "GetPreferredAllocation honours must-include and size (when offered)",
    "re_registers_after_restart": "the plugin registers again after each kubelet restart",
    "unique_socket_per_instance": "every registration uses a new socket file name",
    "socket_removed_on_sigterm": "SIGTERM: the process exits and removes its sockets",
})  # fmt: skip
"""Every check's name and what it demands, in report order."""

Outcome = tuple[CheckStatus, str]

AT_ONCE = 1.0
"""Seconds within which a new stream must get its first list."""
_EXACT = ("Healthy", "Unhealthy")
_NO_LIST: Outcome = ("skip", "no device list received")


@dataclass(frozen=True)
class Connection:
    """One accepted registration and the connection the kubelet made for it."""

    label: str
    registration: Registration
    endpoint: Endpoint


def serves_before_registering(attempts: Sequence[Registration]) -> Outcome:
    if not attempts:
        return "skip", "no Register call arrived"
    late = [r for r in attempts if r.serving_at_register is False]
    if late:
        return "fail", (
            f"Register arrived before {late[0].endpoint} accepted connections "
            f"({len(late)} of {counted(len(attempts), 'call')}): "
            "kubelet >= 1.26 dials the plugin during Register"
        )
    calls = counted(len(attempts), "Register call")
    return "pass", f"the endpoint accepted connections at each Register call ({calls})"


def consistent_options(connections: Sequence[Connection]) -> Outcome:
    if not connections:
        return "skip", "not registered"
    for c in connections:
        sent, answered = c.registration.options, c.endpoint.options
        if sent != answered:
            return "fail", (
                f"RegisterRequest.options {_flags(sent)} but GetDevicePluginOptions {_flags(answered)} "
                f"({c.label}): kubelet >= 1.26 uses only the latter, older ones only the former"
            )
    return (
        "pass",
        f"{_flags(connections[0].endpoint.options)} in both, on {counted(len(connections), 'registration')}",
    )


def _flags(options: PluginOptions) -> str:
    values = (
        f"pre_start_required={options.pre_start_required}",
        f"get_preferred_allocation_available={options.get_preferred_allocation_available}",
    )
    return "(" + ", ".join(values).lower() + ")"


def initial_list_at_once(connections: Sequence[Connection], waited: float) -> Outcome:
    if not connections:
        return "skip", "not registered"
    slowest = 0.0
    for c in connections:
        if not c.endpoint.received_at:
            return "fail", (
                f"no ListAndWatch message within {waited:g} s of the stream opening ({c.label}): "
                "the kubelet shows no capacity until the first list"
            )
        delay = c.endpoint.received_at[0] - c.endpoint.connected_at
        if delay > AT_ONCE:
            return (
                "fail",
                f"first message {delay:.2f} s after the stream opened ({c.label}); it must come at once",
            )
        slowest = max(slowest, delay)
    return (
        "pass",
        f"first list within {slowest * 1000:.0f} ms on each stream ({counted(len(connections), 'stream')})",
    )


def full_lists_only(connections: Sequence[Connection]) -> Outcome:
    if not connections:
        return "skip", "not registered"
    # Nothing changes the plugin's devices during a run, so every message must list the same
    # IDs. Only before the first non-empty list of the first stream may a list be empty (a
    # plugin still discovering its devices): a list that drops devices later is a delta or a
    # partial list, and the kubelet would remove those devices.
    reference: tuple[set[str], str] | None = None
    messages = 0
    for index, c in enumerate(connections):
        for n, devices in enumerate(c.endpoint.raw_lists, 1):
            messages += 1
            ids = {d[0] for d in devices}
            where = f"message {n} ({c.label})"
            if reference is None:
                if ids or index > 0:
                    reference = (ids, where)
                continue
            if ids != reference[0]:
                missing, extra = sorted(reference[0] - ids), sorted(ids - reference[0])
                diff = "; ".join(
                    part for part in (_listed("missing", missing), _listed("extra", extra)) if part
                )
                return "fail", (
                    f"{where} lists {counted(len(ids), 'device')} "
                    f"against {len(reference[0])} in {reference[1]} "
                    f"({diff}): each message replaces the whole set"
                )
    if messages == 0:
        return _NO_LIST
    count = len(reference[0]) if reference is not None else 0
    streams = f"{counted(messages, 'message')} on {counted(len(connections), 'stream')}"
    return "pass", f"{streams}, each listing the same {counted(count, 'device')}"


def _listed(label: str, ids: list[str]) -> str:
    if not ids:
        return ""
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return f"{label} {shown}"


def exact_health_strings(connections: Sequence[Connection]) -> Outcome:
    if not connections:
        return "skip", "not registered"
    messages = devices = 0
    for c in connections:
        for n, listed in enumerate(c.endpoint.raw_lists, 1):
            messages += 1
            devices += len(listed)
            for device_id, health, _ in listed:
                if health not in _EXACT:
                    return "fail", (
                        f"device {device_id} sent with health {health!r} (message {n}, {c.label}): only "
                        '"Healthy" and "Unhealthy" are valid; the kubelet reads anything else as unhealthy'
                    )
    if messages == 0:
        return _NO_LIST
    return "pass", f'{devices} device entries in {messages} messages, all "Healthy" or "Unhealthy"'


def unique_sockets(connections: Sequence[Connection]) -> Outcome:
    if not connections:
        return "skip", "not registered"
    if len(connections) < 2:
        return "skip", "needs a registration after a kubelet restart"
    seen: dict[str, str] = {}
    for c in connections:
        endpoint = c.registration.endpoint
        if endpoint in seen:
            return "fail", (
                f"{endpoint} used again ({seen[endpoint]} and {c.label}): newer kubelets refuse a socket "
                "path whose old endpoint still exists"
            )
        seen[endpoint] = c.label
    return (
        "pass",
        f"{counted(len(connections), 'registration')} on {counted(len(seen), 'distinct socket name')}",
    )


def preferred_problem(chosen: Sequence[str], available: Sequence[str], must: Sequence[str], size: int) -> str:
    """What is wrong with a GetPreferredAllocation answer ("" when nothing is)."""
    if len(chosen) != size:
        return f"{counted(len(chosen), 'device')} instead of {size}"
    if len(set(chosen)) != len(chosen):
        return "a device chosen twice"
    outside = [i for i in chosen if i not in available]
    if outside:
        return f"{', '.join(outside)} not among the available devices"
    left_out = [i for i in must if i not in chosen]
    if left_out:
        return f"must-include {', '.join(left_out)} left out"
    return ""
