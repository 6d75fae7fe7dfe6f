"""DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS parsed as upstream, and the XID verdicts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devplug_nvidia._gpu._xids import DEFAULT_IGNORED_XIDS, FATAL_XIDS, XidFilter, parse_xids

DEFAULTS = {13, 31, 43, 45, 68, 109}


# Upstream's table for its parser (newHealthCheckXIDs).
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, set()),
        ("", set()),
        (",", set()),
        ("not-an-int", set()),
        ("68", {68}),
        ("-68", set()),
        ("68  ", {68}),
        ("68,", {68}),
        (",68", {68}),
        ("68,67", {67, 68}),
        ("68,not-an-int,67", {67, 68}),
        (" 48 , 79 , 94 ", {48, 79, 94}),
        ("48,,79,abc,94", {48, 79, 94}),
        ("0x30", set()),
        ("all", "all"),
        ("ALL", "all"),
        ("xids", "all"),
        ("48, Xids ,79", "all"),
    ],
)
def test_parse(text: str | None, expected: set[int] | str) -> None:
    assert parse_xids(text) == expected


# Upstream's table for the combined rules (getDisabledHealthCheckXids / IsDisabled).
@pytest.mark.parametrize(
    ("disabled", "enabled", "checks_off", "ignored", "counted"),
    [
        ("", "", False, DEFAULTS, {555, 79, 48}),
        ("all", "", True, DEFAULTS | {555, 79}, set()),
        ("xids", "", True, DEFAULTS | {555}, set()),
        ("", "all", False, set(), DEFAULTS | {555}),
        ("11", "11", False, DEFAULTS, {11, 555}),
        ("", "31", False, DEFAULTS - {31}, {31, 555}),
        ("48,79", "", False, DEFAULTS | {48, 79}, {555}),
        ("all", "all", False, set(), DEFAULTS | {555}),
        # Upstream switches checks off here despite its comment; we watch just the enabled one.
        ("all", "48", False, DEFAULTS | {555, 79}, {48}),
    ],
)
def test_rules(disabled: str, enabled: str, checks_off: bool, ignored: set[int], counted: set[int]) -> None:
    xids = XidFilter.from_env({"DP_DISABLE_HEALTHCHECKS": disabled, "DP_ENABLE_HEALTHCHECKS": enabled})
    assert xids.checks_off is checks_off
    assert all(xids.ignores(x) for x in ignored)
    assert not any(xids.ignores(x) for x in counted)


def test_defaults_without_environment() -> None:
    xids = XidFilter.from_env({})
    assert DEFAULT_IGNORED_XIDS == DEFAULTS
    assert xids.describe() == {"ignored_xids": sorted(DEFAULTS), "enabled_xids": []}
    assert [xids.verdict(x) for x in (13, 79, 48, 94, 62)] == [
        "ignored",
        "fatal",
        "fatal",
        "recoverable",
        "recoverable",
    ]


def test_describe() -> None:
    assert XidFilter(disabled="all").describe() == {"xids": "all ignored"}
    assert XidFilter(enabled="all").describe() == {"ignored_xids": [], "enabled_xids": "all"}
    assert XidFilter(enabled=frozenset({31})).describe()["ignored_xids"] == sorted(DEFAULTS - {31})


@given(
    disabled=st.one_of(st.just("all"), st.frozensets(st.integers(0, 200))),
    enabled=st.one_of(st.just("all"), st.frozensets(st.integers(0, 200))),
    xid=st.integers(0, 300),
)
def test_enabled_always_wins_and_fatal_only_when_counted(
    disabled: frozenset[int] | str, enabled: frozenset[int] | str, xid: int
) -> None:
    xids = XidFilter(disabled=disabled, enabled=enabled)  # type: ignore[arg-type]
    if enabled == "all" or xid in enabled:
        assert not xids.ignores(xid)
    if disabled == "all" and not (enabled == "all" or xid in enabled):
        assert xids.ignores(xid)
    verdict = xids.verdict(xid)
    assert (verdict == "ignored") is xids.ignores(xid)
    assert (verdict == "fatal") is (not xids.ignores(xid) and xid in FATAL_XIDS)


@given(
    st.lists(st.integers(0, 10**6), max_size=8),
    st.lists(st.sampled_from(["", " ", "x", "-1"]), max_size=4),
)
def test_parse_keeps_every_number_and_drops_junk(numbers: list[int], junk: list[str]) -> None:
    text = ",".join([*(f" {n} " for n in numbers), *junk])
    assert parse_xids(text) == frozenset(numbers)


def health_section(**fields: Any) -> SimpleNamespace:
    """A stand-in for the config file's ``health`` section (same attribute names)."""
    values: dict[str, Any] = {"disabled": False, "event_types": (), "ignored_xids": (), "critical_xids": None}
    return SimpleNamespace(**(values | fields))


def test_config_section_absent_is_the_environment() -> None:
    env = {"DP_DISABLE_HEALTHCHECKS": "48"}
    assert XidFilter.from_config(None, env) == XidFilter.from_env(env)
    assert XidFilter.from_config(health_section(), {}) == XidFilter()


def test_config_section_rules() -> None:
    assert XidFilter.from_config(health_section(disabled=True), {"DP_ENABLE_HEALTHCHECKS": "48"}).checks_off
    own = XidFilter.from_config(health_section(ignored_xids=(13,)), {"DP_DISABLE_HEALTHCHECKS": "48,79"})
    assert [own.ignores(x) for x in (13, 31, 48, 79, 94)] == [True, False, True, True, False]
    gke = XidFilter.from_config(health_section(ignored_xids=(), critical_xids=(48,)), {})
    assert [gke.verdict(x) for x in (48, 79, 94)] == ["fatal", "ignored", "ignored"]
    assert gke.describe()["critical_xids"] == [48]
    assert XidFilter.from_config(health_section(critical_xids="all"), {}).critical == "all"
    xid_only = XidFilter.from_config(health_section(event_types=("EventTypeXidCriticalError",)), {})
    assert xid_only.event_types == ("EventTypeXidCriticalError",)
    assert xid_only.describe()["event_types"] == ["EventTypeXidCriticalError"]


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("XID 79", "xid"),
        ("double-bit ECC error", "ecc"),
        ("GPU lost (fallen off the bus)", "gpu_lost"),
        ("event wait failed: Unknown Error", "event_wait_failed"),
        ("health check not running: NVML not loaded", "check_not_running"),
        ("something new", "unspecified"),
    ],
)
def test_health_reasons_become_fixed_metric_labels(reason: str, label: str) -> None:
    from devplug_nvidia._gpu._health import _reason_label

    assert _reason_label(reason) == label
