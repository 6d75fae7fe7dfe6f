"""The labels command: flags and their sources, atomic writes, oneshot and interval runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import structlog

from devplug.errors import ConfigError
from devplug_nvidia import labels as labels_module
from devplug_nvidia.labels import (
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_OUTPUT_FILE,
    LabelSettings,
    main,
    parse_args,
    parse_duration,
    run,
    write_labels,
)
from devplug_nvidia.testing import MODELS, write_root

_GFD_ENV = (
    "GFD_MIG_STRATEGY",
    "MIG_STRATEGY",
    "GFD_FAIL_ON_INIT_ERROR",
    "FAIL_ON_INIT_ERROR",
    "GFD_ONESHOT",
    "GFD_NO_TIMESTAMP",
    "GFD_SLEEP_INTERVAL",
    "GFD_OUTPUT_FILE",
    "GFD_MACHINE_TYPE_FILE",
    "GFD_CONFIG_FILE",
    "CONFIG_FILE",
    "NVIDIA_DRIVER_ROOT",
    "DEVPLUG_FAKE_NVML",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _GFD_ENV:
        monkeypatch.delenv(name, raising=False)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _GFD_ENV}


def test_defaults_are_upstreams() -> None:
    settings = parse_args([], environ={})
    assert settings == LabelSettings()
    assert (
        settings.output_file == DEFAULT_OUTPUT_FILE == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    )
    assert settings.machine_type_file == DEFAULT_MACHINE_TYPE_FILE == "/sys/class/dmi/id/product_name"
    assert settings.sleep_interval == 60.0
    assert (settings.oneshot, settings.no_timestamp, settings.fail_on_init_error) == (False, False, True)
    assert settings.mig_strategy == "none"


def test_flags_beat_environment_beats_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nflags:\n  migStrategy: mixed\n  gfd:\n    sleepInterval: 5m\n"
        "    outputFile: /from/file\n    noTimestamp: true\n"
    )
    settings = parse_args(["--config-file", str(config)], environ={})
    assert (settings.mig_strategy, settings.sleep_interval, settings.output_file) == (
        "mixed",
        300.0,
        "/from/file",
    )
    assert settings.no_timestamp
    env = {"GFD_MIG_STRATEGY": "single", "MIG_STRATEGY": "none", "GFD_SLEEP_INTERVAL": "90s"}
    settings = parse_args(["--config-file", str(config)], environ=env)
    assert (settings.mig_strategy, settings.sleep_interval) == ("single", 90.0)
    settings = parse_args(
        ["--config-file", str(config), "--mig-strategy", "none", "-o", "/flag"], environ=env
    )
    assert (settings.mig_strategy, settings.output_file) == ("none", "/flag")
    settings = parse_args([], environ={"CONFIG_FILE": str(config), "GFD_ONESHOT": "true"})
    assert settings.oneshot and settings.mig_strategy == "mixed"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--oneshot"], {"oneshot": True}),
        (["--oneshot=false"], {"oneshot": False}),
        (
            ["--no-timestamp", "--fail-on-init-error=false"],
            {"no_timestamp": True, "fail_on_init_error": False},
        ),
        (["--output", "/x"], {"output_file": "/x"}),
        (["--output-file=/y"], {"output_file": "/y"}),
        (["--sleep-interval", "1m30s"], {"sleep_interval": 90.0}),
        (["--fake-nvml", "dgx-a100", "--driver-root", "/r"], {"fake_nvml": "dgx-a100", "driver_root": "/r"}),
    ],
)
def test_flags(argv: list[str], expected: dict[str, object]) -> None:
    settings = parse_args(argv, environ={})
    assert {k: getattr(settings, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("60s", 60.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("45", 45.0),
        ("250us", 25e-5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "1m-3s", "0s", "-1s", "nan"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--sleep-interval", "soon"], {}, "invalid duration"),
        (["--mig-strategy", "both"], {}, "invalid choice"),
        (["--oneshot=maybe"], {}, "expected true or false"),
        ([], {"GFD_SLEEP_INTERVAL": "0s"}, "GFD_SLEEP_INTERVAL"),
        ([], {"GFD_MIG_STRATEGY": "all"}, "GFD_MIG_STRATEGY"),
        (["--config-file", "/nonexistent/config.yaml"], {}, "config file /nonexistent/config.yaml"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str],
    env: dict[str, str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("devplug-nvidia labels: ")
    assert needle in err


def test_bad_config_file_key_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nflags:\n  gfd:\n    sleepInterval: often\n")
    with pytest.raises(ConfigError, match="sleepInterval"):
        parse_args(["--config-file", str(config)], environ={})
    config.write_text("version: v1\nflags:\n  gfd:\n    sleep: 1s\n")
    with pytest.raises(ConfigError, match="unknown key 'sleep'"):
        parse_args(["--config-file", str(config)], environ={})


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "features.d" / "gfd"
    write_labels({"b": "2", "a": "1"}, target)
    assert target.read_text() == "a=1\nb=2\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["gfd"]

    def fail(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_labels({"a": "changed"}, target)
    assert target.read_text() == "a=1\nb=2\n"  # the old file, whole
    assert [p.name for p in target.parent.iterdir()] == ["gfd"]  # no temporary file left


def _fake_args(tmp_path: Path, model: str = "pcie-a10") -> list[str]:
    """A fake model on a tree written here: for :func:`run`, which lays out none of its own."""
    root = write_root(MODELS[model], tmp_path / "root")
    return ["--fake-nvml", model, "--driver-root", str(root), "--machine-type-file", ""]


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary directory, empty at the start."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_oneshot_writes_once_and_keeps_the_file(tmp_path: Path, tmp: Path) -> None:
    out = tmp_path / "gfd"
    assert main(["--fake-nvml", "pcie-a10", "--oneshot", "-o", str(out)]) == 0
    text = out.read_text()
    assert "nvidia.com/gpu.count=4\n" in text
    assert "nvidia.com/gfd.timestamp=" in text
    assert "nvidia.com/gpu.machine=pcie-a10\n" in text  # the model's tree, laid out and removed
    assert list(tmp.iterdir()) == []


def test_oneshot_to_standard_output(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-nvml", "pcie-a10", "--oneshot", "--no-timestamp", "-o", ""]) == 0
    out, err = capsys.readouterr()
    assert "nvidia.com/gpu.product=NVIDIA-A10\n" in out
    assert "nvidia.com/gpu.mode=compute\n" in out
    assert "warning" not in err
    assert list(tmp.iterdir()) == []


@pytest.mark.anyio
async def test_interval_relabels_then_removes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "gfd"
    settings = parse_args([*_fake_args(tmp_path), "--sleep-interval", "20ms", "-o", str(out)], environ={})
    seen: list[bool] = []
    real = labels_module._output

    def output(labels: dict[str, str], s: LabelSettings) -> None:
        real(labels, s)
        seen.append(out.exists())

    monkeypatch.setattr(labels_module, "_output", output)
    with anyio.fail_after(10):
        await run(settings, runs=3)
    assert seen == [True, True, True]
    assert not out.exists()  # upstream removes the labels when it stops


@pytest.mark.anyio
async def test_interval_until_cancelled(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    settings = parse_args([*_fake_args(tmp_path), "--sleep-interval", "10ms", "-o", str(out)], environ={})
    with anyio.move_on_after(0.5):
        await run(settings)
    assert not out.exists()


def test_an_unknown_fake_model_is_a_bad_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-nvml", "NOSUCH", "--oneshot", "-o", str(tmp_path / "gfd")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("devplug-nvidia labels: invalid setting --fake-nvml: no model 'NOSUCH'; known: ")
    assert err.count("\n") == 1


def test_nvml_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gfd"
    # A driver root without NVML's library: NVML cannot start, whatever this machine has.
    argv = [
        "--driver-root",
        str(tmp_path / "no-driver"),
        "--oneshot",
        "-o",
        str(out),
        "--machine-type-file",
        "",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("devplug-nvidia labels: libnvidia-ml.so.1 not found under the driver root")
    assert not out.exists()
    assert main([*argv, "--fail-on-init-error=false", "--no-timestamp"]) == 0
    assert out.read_text() == "nvidia.com/gpu.machine=unknown\n"


def test_module_runs_on_interval_and_stops_on_sigterm(tmp_path: Path) -> None:
    out, tmp = tmp_path / "gfd", tmp_path / "tmp"
    tmp.mkdir()
    command = [
        sys.executable,
        "-m",
        "devplug_nvidia.labels",
        *("--fake-nvml", "dgx-a100"),
        "--sleep-interval",
        "50ms",
        "-o",
        str(out),
    ]
    env = _env() | {"TMPDIR": str(tmp)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 20
        while not out.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first = out.stat().st_mtime_ns
        while out.exists() and out.stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert b"labels_written" in err
    assert b'"level": "warning"' not in err, err
    assert not out.exists()
    assert list(tmp.iterdir()) == []  # the model's tree went with the SIGTERM
