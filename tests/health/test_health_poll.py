"""health.poll as a watch_devices generator, and the health knobs as settings."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import Device, Health, Settings, load_settings
from devplug.health import HealthPolicy, HealthSettings, poll

H, U = Health.HEALTHY, Health.UNHEALTHY


@pytest.mark.anyio
async def test_poll_runs_the_check_through_the_policy() -> None:
    script: list[Health | Exception] = [H, U, U, RuntimeError("driver gone"), H, H]
    calls = 0

    async def check() -> Sequence[Device]:
        nonlocal calls
        result = script[min(calls, len(script) - 1)]
        calls += 1
        if isinstance(result, Exception):
            raise result
        return [Device(id="a", health=result), Device(id="b")]

    knobs = HealthSettings(unhealthy_after=2, healthy_after=2, recovery_cooldown=0)
    seen: list[tuple[Health, Health]] = []
    with capture_logs() as logs:
        async with aclosing(poll(check, interval=0.001, policy=HealthPolicy(knobs))) as devices:
            async for listed in devices:
                seen.append((listed[0].health, listed[1].health))
                if calls == len(script):
                    break
    # a fails twice, then the check itself fails (unknown: no change), then two good checks.
    assert [a for a, _ in seen] == [H, H, U, U, U, H]
    assert all(b is H for _, b in seen)
    events = [e["event"] for e in logs]
    assert events.count("health_check_failed") == 1 and events.count("health_changed") == 2


@pytest.mark.anyio
async def test_poll_wakes_for_a_cooldown_between_checks() -> None:
    async def check() -> Sequence[Device]:
        return [Device(id="a")]

    # Unhealthy before polling starts; one good check, then only the cool-down's end can
    # bring it back: the next check is an hour away, so the policy's deadline must wake it.
    policy = HealthPolicy(HealthSettings(healthy_after=1, recovery_cooldown=0.05))
    policy.observe("a", False, 0.0)
    seen = []
    with anyio.fail_after(5):
        async with aclosing(poll(check, interval=3600, policy=policy)) as devices:
            async for listed in devices:
                seen.append(listed[0].health)
                if listed[0].health is H:
                    break
    assert seen == [U, H]


def test_health_knobs_are_settings(tmp_path: Path) -> None:
    assert Settings().health == HealthSettings()
    flags = load_settings(Settings, ["--health.unhealthy-after", "5", "--health.flap-limit", "null"])
    assert flags.health.unhealthy_after == 5 and flags.health.flap_limit is None
    config = tmp_path / "c.yaml"
    config.write_text("health:\n  recovery_cooldown: 2.5\n  result_ttl: 30\n")
    from_file = load_settings(Settings, ["--config", str(config)])
    assert (from_file.health.recovery_cooldown, from_file.health.result_ttl) == (2.5, 30)
