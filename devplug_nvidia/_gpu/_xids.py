"""Which XIDs count: upstream's ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` and ours.

Pure: :meth:`XidFilter.from_env` reads a mapping (``os.environ`` in the CLI) and nothing else.

Upstream's rules (NVIDIA's ``internal/rm/health.go``):

* each variable is lower-cased and split on commas; an item is trimmed, ``all`` or ``xids`` means
  every XID (and ends the parsing of that variable), an empty or non-numeric item is skipped;
* XIDs 13, 31, 43, 45, 68 and 109 are ignored by default (application errors: the GPU is fine);
* ``DP_DISABLE_HEALTHCHECKS`` adds XIDs to ignore (``all``: ignore every XID);
* ``DP_ENABLE_HEALTHCHECKS`` forces XIDs back on, over both the defaults and the disabled ones
  (``all``: every XID counts, the defaults included).

The config file's ``health`` section (upstream's newer form) is read by :meth:`XidFilter.from_config`:
``disabled`` turns checks off, ``ignoredXIDs`` replaces the default ignored list, ``criticalXIDs``
(a list) restricts the counted XIDs to those, ``eventTypes`` restricts the events watched; the
environment variables still apply on top.

One deliberate difference: upstream turns health checks off entirely whenever
``DP_DISABLE_HEALTHCHECKS=all``, even when ``DP_ENABLE_HEALTHCHECKS`` names XIDs, although its
own comments say that combination selects just those XIDs. Here it does select them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "DISABLE_ENV",
    "ENABLE_ENV",
    "EVENT_TYPES",
    "FATAL_XIDS",
    "XidFilter",
    "parse_xids",
]

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Application errors upstream never counts: graphics engine exception (13), GPU memory page
fault (31), GPU stopped processing (43), preemptive cleanup (45), video processor exception
(68), context switch timeout (109)."""

FATAL_XIDS = frozenset({48, 64, 79, 95, 119, 120, 140, 154})
"""XIDs after which a GPU never comes back by itself: NVIDIA's XID catalog asks for a GPU reset
or a node reboot. Double-bit ECC error (48), row-remapping failure (64), fallen off the bus
(79), uncontained ECC error (95), GSP RPC timeout (119), GSP error (120), unrecovered ECC
error (140), recovery action required (154). Any other counted XID is recoverable."""

EVENT_TYPES = ("EventTypeXidCriticalError", "EventTypeDoubleBitEccError", "EventTypeSingleBitEccError")
"""The event types watched by default (upstream's names in the config file)."""

Verdict = Literal["ignored", "recoverable", "fatal"]


def parse_xids(value: str | None) -> frozenset[int] | Literal["all"]:
    """One variable as upstream reads it: ``"all"`` or the set of XIDs it names."""
    xids: set[int] = set()
    for raw in (value or "").lower().split(","):
        item = raw.strip()
        if item in ("all", "xids"):
            return "all"
        # Upstream parses unsigned integers: "-68", "0x30" and "abc" are skipped.
        if item.isdigit() and item.isascii():
            xids.add(int(item))
    return frozenset(xids)


@dataclass(frozen=True)
class XidFilter:
    """Which XIDs make a device Unhealthy, and which of those for good."""

    disabled: frozenset[int] | Literal["all"] = frozenset()
    """From DP_DISABLE_HEALTHCHECKS: XIDs ignored on top of the defaults, or all."""
    enabled: frozenset[int] | Literal["all"] = frozenset()
    """From DP_ENABLE_HEALTHCHECKS: XIDs counted whatever else says, or all."""
    default_ignored: frozenset[int] = DEFAULT_IGNORED_XIDS
    fatal: frozenset[int] = FATAL_XIDS
    critical: frozenset[int] | Literal["all"] = "all"
    """From the config's ``criticalXIDs``: the only XIDs counted (unless enabled), or all."""
    event_types: tuple[str, ...] = EVENT_TYPES
    """The NVML event types registered, by upstream's names (``EventTypeXidCriticalError``...)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> XidFilter:
        """The filter for ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` in ``env``."""
        return cls(disabled=parse_xids(env.get(DISABLE_ENV)), enabled=parse_xids(env.get(ENABLE_ENV)))

    @classmethod
    def from_config(cls, health: Any, env: Mapping[str, str]) -> XidFilter:
        """The filter for the config file's ``health`` section (None: absent) and ``env``."""
        base = cls.from_env(env)
        if health is None:
            return base
        if health.disabled:
            return replace(base, disabled="all", enabled=frozenset())
        critical = health.critical_xids
        return replace(
            base,
            default_ignored=frozenset(health.ignored_xids) if health.ignored_xids else DEFAULT_IGNORED_XIDS,
            critical="all" if critical is None or critical == "all" else frozenset(critical),
            event_types=tuple(health.event_types) or EVENT_TYPES,
        )

    @property
    def checks_off(self) -> bool:
        """Health checks are off entirely: every XID disabled and none enabled."""
        return self.disabled == "all" and not self.enabled

    def ignores(self, xid: int) -> bool:
        """Whether XID ``xid`` is not counted."""
        if self.enabled == "all" or xid in self.enabled:
            return False
        if self.disabled == "all" or xid in self.disabled or xid in self.default_ignored:
            return True
        return self.critical != "all" and xid not in self.critical

    def verdict(self, xid: int) -> Verdict:
        """``ignored``, ``fatal`` (the GPU stays Unhealthy) or ``recoverable``."""
        if self.ignores(xid):
            return "ignored"
        return "fatal" if xid in self.fatal else "recoverable"

    def describe(self) -> dict[str, object]:
        """What is ignored, for the start-up log."""
        if self.checks_off:
            return {"xids": "all ignored"}
        ignored: object = "all" if self.disabled == "all" else sorted(self.default_ignored | self.disabled)
        if self.enabled == "all":
            ignored = []
        elif isinstance(ignored, list):
            ignored = [x for x in ignored if x not in self.enabled]
        enabled = "all" if self.enabled == "all" else sorted(self.enabled)
        described: dict[str, object] = {"ignored_xids": ignored, "enabled_xids": enabled}
        if self.critical != "all":
            described["critical_xids"] = sorted(self.critical)
        if self.event_types != EVENT_TYPES:
            described["event_types"] = list(self.event_types)
        return described
