from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from devplug import ConfigError, Settings, load_settings
from devplug.settings import describe_fields


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DEVPLUG_{name.upper()}", raising=False)


def test_defaults() -> None:
    s = load_settings(Settings, [])
    assert s.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert s.kubelet_socket_path == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert s.plugins_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert s.registration == "kubelet"
    assert s.metrics_address is None


def test_precedence_cli_env_file_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("log-level: debug\nretry_max: 3\nregistration: watcher\nretry_initial: 0.5\n")
    monkeypatch.setenv("DEVPLUG_RETRY_MAX", "5")
    monkeypatch.setenv("DEVPLUG_REGISTRATION", "watcher")
    s = load_settings(Settings, ["--config", str(config), "--registration", "kubelet"])
    assert s.registration == "kubelet"  # CLI beats env and file
    assert s.retry_max == 5  # env beats file
    assert s.log_level == "debug"  # file beats default
    assert s.retry_initial == 0.5
    assert s.shutdown_grace == 0.5  # default


def test_config_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"device_plugin_dir": "/k3s/device-plugins"}')
    monkeypatch.setenv("DEVPLUG_CONFIG", str(config))
    assert load_settings(Settings, []).device_plugin_dir == Path("/k3s/device-plugins")


@pytest.mark.parametrize(
    ("argv", "file_text", "message"),
    [
        (["--retry-max", "0"], None, "invalid setting retry_max: must be greater than 0"),
        (
            ["--registration", "both"],
            None,
            "invalid setting registration: Input should be 'kubelet' or 'watcher'",
        ),
        ([], "retry_maxx: 1\n", "invalid setting retry_maxx: unknown setting"),
        ([], "log_level: loud\n", "invalid setting log_level: Input should be"),
        ([], "- a\n- b\n", "expected a mapping of settings, got list"),
        ([], "a: [\n", "line 2: not valid YAML or JSON"),
    ],
)
def test_invalid_settings_name_the_field(
    tmp_path: Path, argv: list[str], file_text: str | None, message: str
) -> None:
    if file_text is not None:
        config = tmp_path / "c.yaml"
        config.write_text(file_text)
        argv = [*argv, "--config", str(config)]
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_settings(Settings, argv)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope\.yaml: No such file or directory"):
        load_settings(Settings, ["--config", str(tmp_path / "nope.yaml")])


def test_unknown_flag_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_settings(Settings, ["--no-such-flag"], prog="devplug")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-such-flag" in err


def test_subclass_adds_options() -> None:
    class Backend(Settings):
        count: int = 4
        """How many devices."""

    s = load_settings(Backend, ["--count", "7", "--device-plugin-dir", "/x"])
    assert (s.count, s.device_plugin_dir) == (7, Path("/x"))


class _Inner(BaseModel):
    depth: int = 1
    """How deep the
    inner part goes."""


def _nested_settings_class() -> type[Settings]:
    class Nested(Settings):
        """A settings class made inside a function (its source is indented)."""

        colour: str = "blue"
        """The colour, in words."""
        inner: _Inner = _Inner()
        """The inner group."""
        undocumented: int = 0

    return Nested


def test_help_text_is_each_fields_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    cls = _nested_settings_class()
    # Nothing is read from the source until help is asked for (that costs every start time).
    assert cls.model_fields["colour"].description is None
    load_settings(cls, ["--colour", "red"])
    assert cls.model_fields["colour"].description is None
    with pytest.raises(SystemExit) as exit_:
        load_settings(cls, ["--help"], prog="nested")
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--colour VALUE The colour, in words. (default: blue)" in text
    assert "How deep the inner part goes." in text  # a nested model's field, docstring cleaned
    assert "The inner group." in text
    # Inherited fields keep the base class's docstrings.
    assert "Seconds in-flight RPCs get to finish on shutdown or restart." in text
    assert cls.model_fields["undocumented"].description is None


def test_describe_fields_keeps_explicit_descriptions() -> None:
    class Described(Settings):
        name: str = Field(default="x", description="given explicitly")
        """A docstring that loses to the explicit description."""

    describe_fields(Described)
    assert Described.model_fields["name"].description == "given explicitly"
    assert Described.model_fields["log_level"].description == "Lowest level logged."
