"""HealthPolicy: hand-written timelines, then hypothesis properties over random ones."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from devplug import Device, Health
from devplug.health import HealthPolicy, HealthSettings, Signal

H, U = Health.HEALTHY, Health.UNHEALTHY
SIGNALS = {"ok": Signal.OK, "fail": Signal.FAIL, "unknown": Signal.UNKNOWN}

# Timelines: (time, what happens) → the health reported right after it. "tick" is time alone.
Step = tuple[float, str, Health]


def run(policy: HealthPolicy, steps: list[Step]) -> None:
    for n, (at, what, expected) in enumerate(steps):
        if what == "tick":
            policy.tick(at)
            got = policy.health("d")
        else:
            got = policy.observe("d", SIGNALS[what], at)
        assert got is expected, f"step {n}: {what} at {at}: {got.value if got else None}"


QUICK = {"recovery_cooldown": 0.0, "flap_limit": None}
TWITCHY = {"unhealthy_after": 1, "healthy_after": 1, "recovery_cooldown": 0.0}


@pytest.mark.parametrize(
    ("knobs", "steps"),
    [
        pytest.param(
            {"unhealthy_after": 3},
            [(0, "ok", H), (1, "fail", H), (2, "fail", H), (3, "fail", U)],
            id="three-failures-to-unhealthy",
        ),
        pytest.param(
            {"unhealthy_after": 3},
            [(0, "ok", H), (1, "fail", H), (2, "fail", H), (3, "ok", H), (4, "fail", H), (5, "fail", H)],
            id="a-good-check-resets-the-count",
        ),
        pytest.param(
            {"unhealthy_after": 3},
            [(0, "ok", H), (1, "fail", H), (2, "unknown", H), (3, "fail", H), (4, "fail", U)],
            id="unknown-does-not-reset-failures",
        ),
        pytest.param({}, [(0, "fail", U)], id="first-result-as-is"),
        pytest.param(
            {"healthy_after": 2, "recovery_cooldown": 30},
            [(0, "fail", U), (10, "ok", U), (20, "ok", U), (39, "tick", U), (40, "tick", H)],
            id="recovery-needs-count-and-cooldown",
        ),
        pytest.param(
            {"healthy_after": 2, **QUICK},
            [(0, "fail", U), (1, "ok", U), (2, "ok", H)],
            id="recovery-by-count-alone",
        ),
        pytest.param(
            {"healthy_after": 2, "recovery_cooldown": 30},
            [
                (0, "fail", U),
                (1, "ok", U),
                (2, "fail", U),
                (3, "ok", U),
                (4, "ok", U),
                (32, "tick", U),
                (33, "tick", H),
            ],
            id="a-failure-restarts-recovery",
        ),
        pytest.param(
            {"healthy_after": 1, "recovery_cooldown": 10},
            [(0, "fail", U), (1, "ok", U), (5, "unknown", U), (6, "ok", U), (15, "tick", U), (16, "tick", H)],
            id="unknown-restarts-recovery",
        ),
        pytest.param(
            {"unknown_timeout": 60},
            [(0, "ok", H), (10, "unknown", H), (30, "unknown", H), (69, "tick", H), (70, "tick", U)],
            id="unknown-until-timeout",
        ),
        pytest.param(
            {"unknown_timeout": 60},
            [(0, "ok", H), (10, "unknown", H), (50, "ok", H), (200, "tick", H)],
            id="unknown-cleared-by-a-result",
        ),
        pytest.param({"unknown_timeout": 5}, [(0, "unknown", H), (5, "tick", U)], id="first-result-unknown"),
        pytest.param(
            {"result_ttl": 10, "unknown_timeout": 60},
            [(0, "ok", H), (9, "tick", H), (69, "tick", H), (70, "tick", U)],
            id="results-expire",
        ),
        pytest.param(
            {**TWITCHY, "flap_limit": 2, "flap_window": 100, "flap_hold": 50},
            [
                (0, "ok", H),
                (1, "fail", U),
                (2, "ok", H),
                (3, "fail", U),
                (4, "ok", U),
                (53, "ok", U),
                (54, "tick", H),
            ],
            id="flapping-holds-unhealthy",
        ),
        pytest.param(
            {**TWITCHY, "flap_limit": 1, "flap_hold": 50},
            [(0, "fail", U), (1, "ok", U), (50, "tick", U), (51, "tick", H)],
            id="a-blocked-recovery-is-held",
        ),
        pytest.param(
            {**TWITCHY, "flap_limit": 2, "flap_window": 10},
            [(0, "fail", U), (1, "ok", H), (20, "fail", U), (21, "ok", H)],
            id="old-changes-leave-the-window",
        ),
    ],
)
def test_timelines(knobs: dict[str, Any], steps: list[Step]) -> None:
    run(HealthPolicy(HealthSettings(**knobs)), steps)


def test_each_change_is_logged_with_its_reason() -> None:
    policy = HealthPolicy(HealthSettings(unhealthy_after=2, healthy_after=1, recovery_cooldown=5))
    with capture_logs() as logs:
        policy.observe("gpu0", True, 0)
        policy.observe("gpu0", False, 1, reason="XID 79")
        policy.observe("gpu0", False, 2, reason="XID 79")
        policy.observe("gpu0", True, 3)
        assert policy.tick(8)[0].health is H
    assert [(e["event"], e["health"], e["reason"]) for e in logs] == [
        ("health_changed", "Unhealthy", "2 consecutive failed checks (last: XID 79)"),
        ("health_changed", "Healthy", "a good check over 5s"),
    ]


def test_update_and_reported_over_device_lists() -> None:
    policy = HealthPolicy(HealthSettings(unhealthy_after=2, unknown_timeout=10))
    sick = Device(id="b", health=U, numa_node=1)
    assert [d.health for d in policy.update([Device(id="a"), Device(id="b")], 0)] == [H, H]
    assert [d.health for d in policy.update([Device(id="a"), sick], 1)] == [H, H]
    out = policy.update([Device(id="a"), sick], 2, unknown={"a"})
    assert [d.health for d in out] == [H, U] and out[1].numa_nodes == (1,)
    assert [d.health for d in policy.reported([Device(id="a"), sick], 12)] == [U, U]  # a: unknown 10 s
    policy.update([Device(id="a")], 13)  # b is gone: forgotten
    assert policy.health("b") is None
    assert policy.update([sick], 14)[0].health is U  # back, and its first result is taken as is


def test_a_device_reported_unhealthy_says_why_and_a_failure_not_acted_on_says_nothing() -> None:
    policy = HealthPolicy(HealthSettings(unhealthy_after=2, unknown_timeout=10))
    hot = Device(id="b", health=U, health_message="95 C")
    first = policy.update([Device(id="a"), hot], 0)
    assert [(d.health, d.health_message) for d in first] == [(H, ""), (U, "first check failed (last: 95 C)")]
    policy.update([Device(id="a"), Device(id="b")], 1)
    held = policy.update([Device(id="a"), Device(id="b")], 2)
    assert [d.health for d in held] == [H, U]
    assert held[1].health_message == "first check failed (last: 95 C)"  # no recovery yet

    other = HealthPolicy(HealthSettings(unhealthy_after=2))
    other.update([Device(id="a")], 0)
    once = other.update([Device(id="a", health=U, health_message="95 C")], 1)
    assert [(d.health, d.health_message) for d in once] == [(H, "")]  # one failure of two
    twice = other.update([Device(id="a", health=U, health_message="96 C")], 2)
    assert [(d.health, d.health_message) for d in twice] == [(U, "2 consecutive failed checks (last: 96 C)")]
    unknown = other.update([Device(id="a")], 3, unknown={"a"})
    assert unknown[0].health_message == "2 consecutive failed checks (last: 96 C)"


def test_next_deadline() -> None:
    policy = HealthPolicy(HealthSettings(healthy_after=1, recovery_cooldown=30, unknown_timeout=60))
    assert policy.next_deadline() is None
    policy.observe("a", False, 0)
    policy.observe("a", True, 5)
    assert policy.next_deadline() == 35
    policy.observe("b", None, 10)
    assert policy.next_deadline() == 35
    policy.tick(35)
    assert policy.next_deadline() == 70


def test_signal_of() -> None:
    assert [Signal.of(v) for v in (True, False, None, H, U, Signal.UNKNOWN)] == [
        Signal.OK,
        Signal.FAIL,
        Signal.UNKNOWN,
        Signal.OK,
        Signal.FAIL,
        Signal.UNKNOWN,
    ]


def test_a_clock_stepping_back_changes_nothing() -> None:
    policy = HealthPolicy(HealthSettings(healthy_after=1, recovery_cooldown=10))
    policy.observe("a", False, 100)
    policy.observe("a", True, 101)
    policy.tick(50)  # ignored: time does not go back
    assert policy.tick(111)[0].health is H


# -- properties over random timelines ------------------------------------------------------


@st.composite
def knob_sets(draw: st.DrawFn) -> HealthSettings:
    return HealthSettings(
        unhealthy_after=draw(st.integers(1, 4)),
        healthy_after=draw(st.integers(1, 4)),
        recovery_cooldown=draw(st.sampled_from([0.0, 5.0, 30.0])),
        unknown_timeout=draw(st.sampled_from([0.0, 10.0, 60.0])),
        result_ttl=draw(st.sampled_from([None, 5.0, 20.0])),
        flap_limit=draw(st.sampled_from([None, 1, 2, 4])),
        flap_window=draw(st.sampled_from([10.0, 100.0])),
        flap_hold=draw(st.sampled_from([0.0, 100.0, 200.0])),
    )


timelines = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.5, 1.0, 4.0, 15.0, 70.0]), st.sampled_from(["ok", "fail", "unknown", "tick"])
    ),
    max_size=40,
)


@settings(max_examples=400)
@given(knob_sets(), timelines)
def test_properties(knobs: HealthSettings, timeline: list[tuple[float, str]]) -> None:
    policy = HealthPolicy(knobs)
    now = 0.0
    reported: Health | None = None
    fails = 0  # failures since the last good check (unknown results do not reset it)
    oks: list[float] = []  # times of the current unbroken run of good checks
    last_known: float | None = None  # time of the last good or failed check
    changes: list[tuple[float, Health]] = []
    for dt, what in timeline:
        now += dt
        if what == "tick":
            due = policy.next_deadline()
            if policy.tick(now):  # time alone changed something: it was announced
                assert due is not None and due <= now
        else:
            policy.observe("d", SIGNALS[what], now)
            fails = 0 if what == "ok" else fails + (what == "fail")
            oks = [*oks, now] if what == "ok" else []
            last_known = now if what != "unknown" else last_known
        health = policy.health("d")
        if health is None:
            continue
        if reported is not None and health is not reported:
            changes.append((now, health))
            if health is U:  # only a run of failures or a long unknown turns a device Unhealthy
                assert fails >= knobs.unhealthy_after or (
                    last_known is None or now - last_known >= knobs.unknown_timeout
                )
            else:  # only a long enough run of good checks brings it back
                assert len(oks) >= knobs.healthy_after
                assert now - oks[0] >= knobs.recovery_cooldown
        if fails >= knobs.unhealthy_after:
            assert health is U
        reported = health
        if knobs.flap_limit is not None and knobs.flap_hold >= knobs.flap_window:
            recent = [t for t, _ in changes if t > now - knobs.flap_window]
            assert len(recent) <= knobs.flap_limit + 1


@settings(max_examples=100)
@given(knob_sets(), timelines)
def test_deterministic_and_every_change_logged(
    knobs: HealthSettings, timeline: list[tuple[float, str]]
) -> None:
    def replay() -> tuple[list[Health | None], list[dict[str, Any]]]:
        policy = HealthPolicy(knobs)
        now, seen = 0.0, []
        with capture_logs() as logs:
            for dt, what in timeline:
                now += dt
                if what == "tick":
                    policy.tick(now)
                else:
                    policy.observe("d", SIGNALS[what], now)
                seen.append(policy.health("d"))
        return seen, logs

    first, logs = replay()
    assert replay() == (first, logs)
    flips = sum(1 for a, b in pairwise(first) if a is not None and a is not b)
    initial = 1 if any(e.get("reason", "").startswith("first check failed") for e in logs) else 0
    assert sum(e["event"] == "health_changed" for e in logs) == flips + initial


def test_all_good_stays_healthy() -> None:
    policy = HealthPolicy()
    assert all(policy.observe("d", True, t) is H for t in range(1000))
