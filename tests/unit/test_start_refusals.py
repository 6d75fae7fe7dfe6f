"""What the kubelet would refuse for ever is refused at start, with one line and status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devplug import ConfigError, Runner, Settings
from devplug._names import is_extended_resource_name, resource_name_problem
from devplug.settings import load_settings
from devplug_fake import FakeSettings
from devplug_nvidia._config._file import read_config_file
from tests.support import ROOT, Widgets

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("example.com/widget", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("gpu", False),
        ("nvidia.com/", False),
        ("/gpu", False),
        ("kubernetes.io/gpu", False),
        ("example.kubernetes.io/gpu", False),
        ("requests.example.com/gpu", False),
        ("Example.com/gpu", False),
        ("example.com/" + "g" * 64, False),
        ("example.com/a/b", False),
    ],
)
def test_extended_resource_names(name: str, ok: bool) -> None:
    assert is_extended_resource_name(name) is ok
    assert (resource_name_problem(name) is None) is ok


@pytest.mark.parametrize("name", ["gpu", "nvidia.com/", "kubernetes.io/gpu"])
async def test_runner_refuses_a_bad_name_before_serving(short_dir: Path, name: str) -> None:
    settings = Settings(device_plugin_dir=short_dir / "dp")
    with pytest.raises(ConfigError, match=f"plugin Widgets: '{name}' is not an extended resource name"):
        await Runner(Widgets(name), settings).run(handle_signals=False)
    assert not (short_dir / "dp").exists() or list((short_dir / "dp").iterdir()) == []


async def test_runner_refuses_a_socket_path_over_107_bytes(short_dir: Path) -> None:
    settings = Settings(device_plugin_dir=short_dir / ("d" * 90))
    with pytest.raises(ConfigError, match="over the 107-byte limit of a unix socket"):
        await Runner(Widgets(), settings).run(handle_signals=False)


def test_devplug_run_bad_name_is_one_line_and_status_2(short_dir: Path) -> None:
    (short_dir / "badname.py").write_text(
        "from tests.support import Widgets\n\n\nclass Gpu(Widgets):\n    resource_name = 'gpu'\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "run", "badname:Gpu", "--device-plugin-dir", str(short_dir / "dp")],
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{short_dir}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("devplug run badname:Gpu: plugin Gpu: 'gpu' is not an extended resource name")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "devcie_plugin_dir: /x\n",
            'invalid setting devcie_plugin_dir: unknown setting (did you mean "device_plugin_dir"?)',
        ),
        ("retry-maxx: 1\n", 'invalid setting retry_maxx: unknown setting (did you mean "retry_max"?)'),
        ("zzz: 1\n", "invalid setting zzz: unknown setting"),
        (
            "health:\n  unhealthy_afer: 2\n",
            'invalid setting health.unhealthy_afer: unknown setting (did you mean "unhealthy_after"?)',
        ),
    ],
)
def test_a_settings_typo_names_the_closest_key(short_dir: Path, text: str, message: str) -> None:
    config = short_dir / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(Settings, ["--config", str(config)])
    assert str(info.value) == message


def test_a_fake_scenario_typo_names_the_closest_key(short_dir: Path) -> None:
    config = short_dir / "c.yaml"
    config.write_text("resources:\n- name: example.com/a\n  faults:\n    allocate_error_evry: 2\n")
    with pytest.raises(ConfigError) as info:
        load_settings(FakeSettings, ["--config", str(config)])
    assert str(info.value).endswith('unknown setting (did you mean "allocate_error_every"?)')


def test_an_nvidia_config_typo_names_the_closest_key(short_dir: Path) -> None:
    config = short_dir / "n.yaml"
    config.write_text("version: v1\nflags:\n  migStrategi: single\n")
    with pytest.raises(ConfigError) as info:
        read_config_file(config)
    assert str(info.value) == (
        f"config file {config}: unknown key 'migStrategi' under flags (did you mean \"migStrategy\"?)"
    )
