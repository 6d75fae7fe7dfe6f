"""Bad configuration files and arguments for every command: exit status 2 and one line naming
the problem on stderr, never a traceback.

Each case is a real process. They are started together (a few at a time) by one module
fixture, so the table stays broad while the run stays short; each case is still its own test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Variables the commands read that the environment of the test run must not decide.
_DROPPED = ("MIG_STRATEGY", "CONFIG_FILE", "FAIL_ON_INIT_ERROR", "NVIDIA_DRIVER_ROOT", "DEVPLUG_FAKE_NVML")


@dataclass(frozen=True)
class Case:
    """``python -m ARGV`` (``{d}`` is the case's own directory) and what its one line must say."""

    id: str
    argv: tuple[str, ...]
    expected: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    """Directories to create under ``{d}``, with their mode."""


RUN = ("devplug", "run", "tests.support:Widgets")
FAKE = ("devplug_fake",)
NVIDIA = ("devplug_nvidia",)
LABELS = ("devplug_nvidia", "labels")
INSPECT = ("devplug", "inspect")
CONFORMANCE = ("devplug", "conformance")
SCENARIO_FLAP = """\
resources:
  - name: example.com/gpu
    faults:
      health_flaps: [{device: fake-0, every: 1, down_for: 2}]
"""

CASES = [
    # A JSON value that does not parse, on the command line or in a DEVPLUG_* variable.
    Case(
        "run-json-flag-unclosed",
        (*RUN, "--api", "dra", "--device-metadata-versions", "[v1beta1"),
        ("invalid setting --device-metadata-versions: '[v1beta1' is not valid JSON",),
    ),
    Case(
        "run-json-flag-object",
        (*RUN, "--health={bad"),
        ("invalid setting --health: '{bad' is not valid JSON",),
    ),
    Case(
        "run-json-env",
        RUN,
        ("invalid setting:", 'field "health" from source "EnvSettingsSource"'),
        env={"DEVPLUG_HEALTH": "{bad"},
    ),
    # devplug run: the standard runner options, from flags, DEVPLUG_* and --config.
    Case(
        "run-config-missing",
        (*RUN, "--config", "{d}/missing.yaml"),
        ("cannot read the config file", "missing.yaml: no such file"),
    ),
    Case(
        "run-config-syntax",
        (*RUN, "--config", "{d}/c.yaml"),
        ("c.yaml line 3: not valid YAML or JSON",),
        files={"c.yaml": "retry_max: 1\nlog_level: [debug\n"},
    ),
    Case(
        "run-config-not-utf8",
        (*RUN, "--config", "{d}/c.yaml"),
        ("c.yaml: not UTF-8 text (byte 11)",),
        files={"c.yaml": b"retry_max: \xff\xfe\n"},
    ),
    Case(
        "run-config-list",
        (*RUN, "--config", "{d}/c.yaml"),
        ("expected a mapping of settings, got list",),
        files={"c.yaml": "- retry_max\n"},
    ),
    Case(
        "run-config-unknown-key",
        (*RUN, "--config", "{d}/c.json"),
        ("invalid setting retry_maximum: unknown setting",),
        files={"c.json": '{"retry_maximum": 3}'},
    ),
    Case(
        "run-config-wrong-type",
        (*RUN, "--config", "{d}/c.yaml"),
        ("invalid setting register_timeout", "'soon'"),
        files={"c.yaml": "register_timeout: soon\n"},
    ),
    Case(
        "run-metrics-address",
        (*RUN, "--metrics-address", "localhost"),
        ("invalid setting --metrics-address",),
    ),
    Case("run-insecure-dir-value", (*RUN, "--insecure-dir", "maybe"), ("invalid setting --insecure-dir",)),
    Case(
        "run-env-log-level",
        RUN,
        ("invalid setting DEVPLUG_LOG_LEVEL", "'loud'"),
        env={"DEVPLUG_LOG_LEVEL": "loud"},
    ),
    Case(
        "run-world-writable-dir",
        (*RUN, "--device-plugin-dir", "{d}/open"),
        ("refusing to start", "/open is writable by every user (mode 0777)", "--insecure-dir=warn"),
        modes={"open": 0o777},
    ),
    Case(
        "run-dir-is-a-file",
        (*RUN, "--device-plugin-dir", "{d}/c.txt"),
        ("c.txt exists and is not a directory",),
        files={"c.txt": "not a directory"},
    ),
    Case("run-no-target", ("devplug", "run"), ("the following arguments are required: MODULE:CLASS",)),
    # devplug inspect and devplug conformance: argparse, with the kubelet's own rules.
    Case("inspect-no-socket", INSPECT, ("the following arguments are required: SOCKET",)),
    Case("inspect-timeout", (*INSPECT, "x.sock", "--timeout", "0"), ("--timeout",)),
    Case("inspect-size-alone", (*INSPECT, "x.sock", "--size", "2"), ("--size go with --preferred",)),
    Case("conformance-no-command", CONFORMANCE, ("no plugin command given",)),
    Case("conformance-missing-command", (*CONFORMANCE, "--", "{d}/no-such-plugin"), ("cannot start",)),
    # devplug-fake: flags and scenario files.
    Case("fake-count-word", (*FAKE, "--count", "many"), ("invalid setting --count",)),
    Case(
        "fake-scenario-flap",
        (*FAKE, "--config", "{d}/s.yaml"),
        ("resources.0.faults.health_flaps.0", "down_for must be shorter than every"),
        files={"s.yaml": SCENARIO_FLAP},
    ),
    Case(
        "fake-scenario-unknown-key",
        (*FAKE, "--config", "{d}/s.yaml"),
        ("resources.0.colour",),
        files={"s.yaml": "resources:\n  - {name: example.com/gpu, colour: red}\n"},
    ),
    Case(
        "fake-scenario-probability",
        (*FAKE, "--config", "{d}/s.yaml"),
        ("resources.0.faults.allocate_error_probability", "less than or equal to 1"),
        files={"s.yaml": "resources:\n  - faults: {allocate_error_probability: 2}\n"},
    ),
    # devplug-nvidia: flags, NVIDIA's environment variables and --config-file.
    Case(
        "nvidia-list-strategy",
        (*NVIDIA, "--device-list-strategy", "nope"),
        ("invalid setting --device-list-strategy",),
    ),
    Case(
        "nvidia-env-mig", NVIDIA, ("invalid setting MIG_STRATEGY", "'bogus'"), env={"MIG_STRATEGY": "bogus"}
    ),
    Case(
        "nvidia-config-missing",
        (*NVIDIA, "--config-file", "{d}/missing.yaml"),
        ("cannot read the config file", "no such file"),
    ),
    Case(
        "nvidia-config-version",
        (*NVIDIA, "--config-file", "{d}/c.yaml"),
        ("version", "only v1"),
        files={"c.yaml": "version: v2\n"},
    ),
    Case(
        "nvidia-config-misplaced",
        (*NVIDIA, "--config-file", "{d}/c.yaml"),
        ("'renameByDefault' under flags", "belongs under"),
        files={"c.yaml": "flags:\n  renameByDefault: true\n"},
    ),
    Case(
        "nvidia-config-syntax",
        (*NVIDIA, "--config-file", "{d}/c.yaml"),
        ("c.yaml",),
        files={"c.yaml": "flags: {migStrategy: [\n"},
    ),
    # devplug-nvidia labels: gpu-feature-discovery's flags, GFD_* variables and config file.
    Case("labels-sleep-interval", (*LABELS, "--sleep-interval", "0s"), ("greater than 0",)),
    Case("labels-unknown-flag", (*LABELS, "--bogus"), ("unrecognized arguments: --bogus",)),
    Case("labels-env", LABELS, ("GFD_ONESHOT", "expected true or false"), env={"GFD_ONESHOT": "maybe"}),
    # DRA mode: names, the node, the API server's configuration.
    Case(
        "dra-no-node",
        (*FAKE, "--api", "dra", "--kubelet-root", "{d}/k"),
        ("no node name", "--node-name", "NODE_NAME"),
    ),
    Case(
        "dra-driver-name",
        (*FAKE, "--api", "dra", "--driver-name", "Fake_Driver", "--node-name", "n1"),
        ("invalid setting --driver-name", "DNS subdomain"),
    ),
    Case(
        "dra-node-name",
        (*RUN, "--api", "dra", "--node-name", "Node One"),
        ("invalid setting --node-name", "DNS subdomain"),
    ),
    Case(
        "dra-node-name-env",
        (*FAKE, "--api", "dra", "--kubelet-root", "{d}/k"),
        ("invalid setting NODE_NAME",),
        env={"NODE_NAME": "under_score"},
    ),
    Case(
        "dra-api-typo",
        (*FAKE, "--api", "dra2"),
        ("invalid setting --api", "device-plugin", "dra"),
    ),
    Case(
        "dra-kubeconfig-missing",
        (*RUN, "--api", "dra", "--node-name", "n1", "--kubelet-root", "{d}/k", "--kubeconfig", "{d}/kc.yaml"),
        ("kubeconfig", "kc.yaml"),
    ),
    Case(
        "dra-kubeconfig-garbage",
        (*FAKE, "--api=dra", "--node-name=n1", "--kubelet-root={d}/k", "--kubeconfig={d}/kc.yaml"),
        ("kubeconfig", "kc.yaml"),
        files={"kc.yaml": "this: [is not a kubeconfig\n"},
    ),
]

# Found by this table, outside the code these tests may change; kept as strict xfails so that a
# fix shows up as an unexpected pass.
KNOWN_BUGS: dict[str, str] = {}
CASES.append(
    Case(
        "nvidia-world-writable-dir",
        # The directory is checked when serving starts, after discovery has logged at info level.
        (*NVIDIA, "--fake-nvml", "dgx-a100", "--log-level", "warning", "--device-plugin-dir", "{d}/open"),
        ("refusing to start", "/open is writable by every user"),
        modes={"open": 0o777},
    )
)


def _prepare(case: Case, directory: Path) -> tuple[list[str], dict[str, str]]:
    directory.mkdir()
    for name, content in case.files.items():
        path = directory / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    for name, mode in case.modes.items():
        (directory / name).mkdir()
        os.chmod(directory / name, mode)  # the umask would cut it
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED and not k.startswith("DEVPLUG_")}
    env |= {"PYTHONPATH": str(ROOT)} | case.env
    argv = [a.replace("{d}", str(directory)) for a in case.argv]
    return [sys.executable, "-m", *argv], env


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    base = tmp_path_factory.mktemp("bad-config")
    commands = {case.id: _prepare(case, base / case.id) for case in CASES}

    def run(case_id: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        argv, env = commands[case_id]
        # stdin closed: a case that wrongly starts serving ends at the timeout, not never.
        result = subprocess.run(
            argv,
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        return case_id, result

    with ThreadPoolExecutor(max_workers=4) as pool:
        yield dict(pool.map(run, commands))


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[c.id]))
        if c.id in KNOWN_BUGS
        else pytest.param(c, id=c.id)
        for c in CASES
    ],
)
def test_bad_input_exits_2_with_one_line(
    case: Case, results: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    result = results[case.id]
    err = result.stderr
    assert "Traceback" not in err, err
    assert result.returncode == 2, f"exit status {result.returncode}: {err}"
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    for text in case.expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert result.stdout == ""
