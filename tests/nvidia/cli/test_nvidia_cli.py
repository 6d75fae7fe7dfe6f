from __future__ import annotations

import os
import subprocess
import sys


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if k not in ("MIG_STRATEGY", "CONFIG_FILE", "FAIL_ON_INIT_ERROR")
    }
    return subprocess.run(
        [sys.executable, "-m", "devplug_nvidia", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=base | (env or {}),
    )


def test_help_lists_nvidia_flags() -> None:
    proc = _run("--help")
    assert proc.returncode == 0
    for flag in (
        "--mig-strategy",
        "--fail-on-init-error",
        "--device-list-strategy",
        "--config-file",
        "--kubelet-socket",
        "--fake-nvml",
        "--device-plugin-dir",
    ):
        assert flag in proc.stdout


def test_bad_flag_exit_2() -> None:
    proc = _run("--mig-strategy", "bogus")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1


def test_help_names_the_commands_and_the_models() -> None:
    from devplug_nvidia.testing import MODELS

    proc = _run("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    text = proc.stdout
    assert "devplug-nvidia labels [OPTIONS]" in text and "\n  labels [OPTIONS] " in text
    assert "devplug-nvidia fake-root MODEL DIR" in text and "\n  fake-root MODEL DIR " in text
    fake_nvml = text[text.index("--fake-nvml MODEL") : text.index("health options:")]
    for name in MODELS:
        assert name in " ".join(fake_nvml.split())  # in --fake-nvml's own help
        assert f"\n  {name} " in text  # and in the list of models at the end
    assert _run("-h").stdout == text


def test_help_placeholders_read_as_words() -> None:
    text = _run("--help").stdout
    for placeholder in (
        "--device-list-strategy STRATEGY[,STRATEGY]",
        "--mig-strategy STRATEGY",
        "--driver-root PATH",
        "--dev-root PATH",
        "--config-file FILE",
        "--imex-channel-ids ID[,ID]",
        "--cdi-feature-flags FLAG[,FLAG]",
        "--fake-nvml MODEL",
        "--shared-devices-allocation-policy POLICY",
    ):
        assert placeholder in text
    for generated in ("null}", "tuple[", "{str", "{Path", "('envvar',)", "(default: ())"):
        assert generated not in text, generated
    assert "(default: envvar)" in " ".join(text.split())


def test_labels_help_lists_the_models_and_placeholders() -> None:
    from devplug_nvidia.testing import MODELS

    proc = _run("labels", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert all(name in text for name in MODELS)
    for placeholder in (
        "--fake-nvml MODEL",
        "--sleep-interval DURATION",
        "--oneshot [BOOL]",
        "--driver-root PATH",
    ):
        assert placeholder in text
    assert "$GFD_ONESHOT" in text
