from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devplug import ConfigError
from devplug_nvidia import load_nvidia_settings

TS = {"resources": [{"name": "gpu", "replicas": 2}]}

# (config file document, extra argv, substrings the one-line message must contain)
FILE_ERRORS: list[tuple[dict[str, Any], list[str], list[str]]] = [
    ({"version": "v2"}, [], ["version", "only v1"]),
    (
        {"flags": {"renameByDefault": True}},
        [],
        ["'renameByDefault' under flags", "belongs under sharing.timeSlicing or sharing.mps"],
    ),
    (
        {"flags": {"passDeviceSpecs": True}},
        [],
        ["'passDeviceSpecs' under flags", "belongs under flags.plugin"],
    ),
    (
        {"flags": {"plugin": {"migStrategy": "mixed"}}},
        [],
        ["'migStrategy' under flags.plugin", "belongs under flags"],
    ),
    (
        {
            "sharing": {
                "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "renameByDefault": True}]}
            }
        },
        [],
        ["'renameByDefault' under sharing.timeSlicing.resources[0]", "belongs under sharing.timeSlicing"],
    ),
    ({"timeSlicing": TS}, [], ["'timeSlicing' under the top level", "belongs under sharing"]),
    ({"flags": {"bogus": 1}}, [], ["unknown key 'bogus' under flags"]),
    ({"flags": {"migStrategy": "bogus"}}, [], ["flags.migStrategy", "'bogus'"]),
    (
        {"flags": {"plugin": {"deviceListStrategy": ["envvar", "nope"]}}},
        [],
        ["flags.plugin.deviceListStrategy[1]"],
    ),
    ({"flags": {"plugin": {"deviceIDStrategy": "serial"}}}, [], ["flags.plugin.deviceIDStrategy"]),
    (
        {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 1}]}}},
        [],
        ["sharing.timeSlicing.resources[0].replicas", "at least 2"],
    ),
    (
        {"sharing": {"timeSlicing": {"resources": [{"name": "gpu"}]}}},
        [],
        ["sharing.timeSlicing.resources[0].replicas", "Field required"],
    ),
    ({"sharing": {"timeSlicing": {"resources": []}}}, [], ["sharing.timeSlicing.resources"]),
    (
        {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": "some"}]}}},
        [],
        ["devices", "only valid string is 'all'"],
    ),
    (
        {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": 0}]}}},
        [],
        ["devices", "must be > 0"],
    ),
    (
        {
            "sharing": {
                "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": ["GPU-nope"]}]}
            }
        },
        [],
        ["devices", "'GPU-nope'"],
    ),
    (
        {"sharing": {"timeSlicing": {"resources": [{"name": "amd.com/gpu", "replicas": 2}]}}},
        [],
        ["name", "nvidia.com/ prefix"],
    ),
    ({"sharing": {"timeSlicing": TS, "mps": TS}}, [], ["sharing", "mutually exclusive"]),
    (
        {
            "flags": {"mpsRoot": "/m"},
            "sharing": {"mps": {"resources": [{"name": "mig-1g.5gb", "replicas": 2}]}},
        },
        [],
        ["MPS", "MIG"],
    ),
    (
        {
            "flags": {"mpsRoot": "/m"},
            "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2, "devices": ["0:1"]}]}},
        },
        [],
        ["MPS", "MIG"],
    ),
    ({"sharing": {"mps": TS}}, [], ["requires --mps-root"]),
    (
        {"flags": {"mpsRoot": "/m", "migStrategy": "mixed"}, "sharing": {"mps": TS}},
        [],
        ["mixed", "not supported with MPS"],
    ),
    (
        {"flags": {"mpsRoot": "/m"}, "sharing": {"mps": TS}},
        ["--mig-strategy", "mixed"],
        ["mixed", "not supported with MPS"],
    ),
    ({"resources": {"gpus": [{"pattern": "*", "name": "bad name"}]}}, [], ["resources.gpus[0].name"]),
    ({"resources": {"gpus": [{"name": "a"}]}}, [], ["resources.gpus[0].pattern", "Field required"]),
    ({"imex": {"channelIDs": [1]}}, [], ["--imex-channel-ids", "empty or [0]"]),
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MIG_STRATEGY", "CONFIG_FILE", "MPS_ROOT", "DEVICE_LIST_STRATEGY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("doc", "argv", "parts"), FILE_ERRORS)
def test_file_errors(tmp_path: Path, doc: dict[str, Any], argv: list[str], parts: list[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        load_nvidia_settings([*argv, "--config-file", str(cfg)])
    message = str(info.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["--mig-strategy", "bogus"], ["invalid setting --mig-strategy:", "'bogus'"]),
        (["--device-list-strategy", "envvar,bogus"], ["invalid setting --device-list-strategy:"]),
        (["--device-id-strategy", "serial"], ["invalid setting --device-id-strategy:"]),
        (["--device-discovery-strategy", "x"], ["invalid setting --device-discovery-strategy:"]),
        (["--imex-channel-ids", "3"], ["invalid setting --imex-channel-ids:"]),
        (
            ["--shared-devices-allocation-policy", "random"],
            ["invalid setting --shared-devices-allocation-policy:"],
        ),
        (
            ["--config-file", "/nonexistent/c.yaml"],
            ["cannot read the config file /nonexistent/c.yaml: no such file or directory"],
        ),
    ],
)
def test_flag_errors(argv: list[str], parts: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_nvidia_settings(argv)
    for part in parts:
        assert part in str(info.value)


def test_env_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIG_STRATEGY", "bogus")
    with pytest.raises(ConfigError, match=r"^invalid setting MIG_STRATEGY: "):
        load_nvidia_settings([])


def test_invalid_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("flags: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML or JSON"):
        load_nvidia_settings(["--config-file", str(cfg)])


@pytest.mark.parametrize(
    ("argv", "doc", "part"),
    [
        (["--mig-strategy", "bogus"], None, "invalid setting --mig-strategy:"),
        ([], {"flags": {"renameByDefault": True}}, "belongs under sharing.timeSlicing"),
    ],
)
def test_exit_code_2(tmp_path: Path, argv: list[str], doc: dict[str, Any] | None, part: str) -> None:
    if doc is not None:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(json.dumps(doc))
        argv = [*argv, "--config-file", str(cfg)]
    env = {k: v for k, v in os.environ.items() if k not in ("MIG_STRATEGY", "CONFIG_FILE")}
    proc = subprocess.run(
        [sys.executable, "-m", "devplug_nvidia", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("devplug-nvidia: ") and part in lines[0]
