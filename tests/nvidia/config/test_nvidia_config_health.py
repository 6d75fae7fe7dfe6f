"""The config file's ``health`` section: accepted as upstream writes it, strict otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devplug import ConfigError
from devplug_nvidia import load_nvidia_settings
from devplug_nvidia._config._file import HealthConfig, parse_config

P = Path("c.yaml")


def test_upstream_example_parses() -> None:
    doc = {
        "health": {
            "disabled": False,
            "eventTypes": ["EventTypeXidCriticalError", "EventTypeDoubleBitEccError"],
            "ignoredXIDs": [13, 31, 43],
            "criticalXIDs": "ALL",
        }
    }
    health = parse_config(doc, P).health
    assert health is not None and not health.disabled
    assert health.event_types == ("EventTypeXidCriticalError", "EventTypeDoubleBitEccError")
    assert (health.ignored_xids, health.critical_xids) == ((13, 31, 43), "all")
    assert parse_config({"health": {"criticalXIDs": [48]}}, P).health == HealthConfig.model_validate(
        {"criticalXIDs": [48]}
    )
    assert parse_config({}, P).health is None


@pytest.mark.parametrize(
    ("doc", "parts"),
    [
        ({"health": {"eventTypes": ["Bogus"]}}, ["health.eventTypes[0]"]),
        ({"health": {"criticalXIDs": "some"}}, ["health.criticalXIDs", "'all' or a list"]),
        ({"health": {"ignoredXIDs": [48], "criticalXIDs": [48, 79]}}, ["XID 48 is in both"]),
        ({"health": {"ignoredXids": [1]}}, ["unknown key 'ignoredXids' under health"]),
        ({"flags": {"ignoredXIDs": [1]}}, ["'ignoredXIDs' under flags", "belongs under health"]),
    ],
)
def test_health_errors(doc: dict[str, Any], parts: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, P)
    for part in parts:
        assert part in str(err.value), str(err.value)


def test_health_reaches_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CONFIG_FILE", "MIG_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"health": {"disabled": True}}))
    settings = load_nvidia_settings(["--config-file", str(cfg)])
    assert settings.health_config == HealthConfig.model_validate({"disabled": True})
    assert load_nvidia_settings([]).health_config is None
