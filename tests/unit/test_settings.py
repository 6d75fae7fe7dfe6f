from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from devplug import ConfigError, HealthSettings, Settings, load_settings
from devplug._settings_groups import KubeletGroup, RegistrationGroup
from devplug.settings import GROUPS, describe_fields, fields_of, group_of
from devplug_fake._config import FakeSettings
from devplug_nvidia.config import NvidiaSettings


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
        (["--retry-max", "0"], None, "invalid setting --retry-max: must be greater than 0"),
        (
            ["--registration", "both"],
            None,
            "invalid setting --registration: Input should be 'kubelet' or 'watcher'",
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


@pytest.mark.parametrize("level", ["DEBUG", "Debug", "debug"])
def test_log_level_in_any_case(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(Settings, ["--log-level", level]).log_level == "debug"
    monkeypatch.setenv("DEVPLUG_LOG_LEVEL", level.swapcase())
    assert load_settings(Settings, []).log_level == "debug"


@pytest.mark.parametrize(
    ("argv", "env", "file_text", "named"),
    [
        (["--retry-max", "0"], {}, None, "--retry-max"),
        (["--health.flap-limit", "x"], {}, None, "--health.flap-limit"),
        ([], {"DEVPLUG_RETRY_MAX": "0"}, None, "DEVPLUG_RETRY_MAX"),
        ([], {"NODE_NAME": "Node One"}, None, "NODE_NAME"),
        ([], {}, "retry_max: 0\n", "retry_max"),
        ([], {}, "health:\n  flap_limit: x\n", "health.flap_limit"),
        # The command line wins over the variable, and is what the error names.
        (["--retry-max", "0"], {"DEVPLUG_RETRY_MAX": "1"}, None, "--retry-max"),
    ],
)
def test_an_invalid_setting_is_named_as_it_was_given(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    argv: list[str],
    env: dict[str, str],
    file_text: str | None,
    named: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if file_text is not None:
        (tmp_path / "c.yaml").write_text(file_text)
        argv = [*argv, "--config", str(tmp_path / "c.yaml")]
    with pytest.raises(ConfigError) as info:
        load_settings(Settings, argv)
    assert str(info.value).startswith(f"invalid setting {named}: "), info.value


def test_a_misspelled_variable_gets_a_did_you_mean(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DEVPLUG_LOG_LEVL", "debug")
    monkeypatch.setenv("DEVPLUG_E2E_K8S", "v1.36.3")  # another program's: no warning
    settings = load_settings(Settings, [], prog="devplug run")
    assert settings.log_level == "info"
    warning = 'unknown setting DEVPLUG_LOG_LEVL (did you mean "DEVPLUG_LOG_LEVEL"?), ignored'
    assert capsys.readouterr().err == f"devplug run: warning: {warning}\n"


def test_a_variable_that_only_shares_a_word_with_a_setting_is_not_warned_about(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from devplug_nvidia.config import NvidiaSettings

    monkeypatch.setenv("DEVPLUG_E2E_REQUIRED", "1")  # .ci/run's; devplug-nvidia has IMEX_REQUIRED
    load_settings(NvidiaSettings, [], prog="devplug-nvidia")
    assert capsys.readouterr().err == ""


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^cannot read the config file .*nope\.yaml: no such file or directory$"
    ):
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


# -- the external interface, recorded before the settings were grouped --------------------------
# field, flag, environment variable, default (no DEVPLUG_*, NODE_NAME or POD_UID set), a value as
# typed on a command line, and what it parses to. Flags, DEVPLUG_* names and config-file keys are
# the interface of every command: grouping the fields must leave each of them as it was.
INTERFACE: list[tuple[str, str, str, object, str, object]] = [
    ("api", "--api", "DEVPLUG_API", "device-plugin", "dra", "dra"),
    (
        "withhold_device_plugin_pods",
        "--withhold-device-plugin-pods",
        "DEVPLUG_WITHHOLD_DEVICE_PLUGIN_PODS",
        False,
        "true",
        True,
    ),
    (
        "pod_resources_interval",
        "--pod-resources-interval",
        "DEVPLUG_POD_RESOURCES_INTERVAL",
        10.0,
        "2.5",
        2.5,
    ),
    ("kubelet_root", "--kubelet-root", "DEVPLUG_KUBELET_ROOT", Path("/var/lib/kubelet"), "/k", Path("/k")),
    (
        "device_plugin_dir",
        "--device-plugin-dir",
        "DEVPLUG_DEVICE_PLUGIN_DIR",
        Path("/var/lib/kubelet/device-plugins"),
        "/dp",
        Path("/dp"),
    ),
    ("kubelet_socket", "--kubelet-socket", "DEVPLUG_KUBELET_SOCKET", None, "/dp/k.sock", Path("/dp/k.sock")),
    ("registration", "--registration", "DEVPLUG_REGISTRATION", "kubelet", "watcher", "watcher"),
    (
        "plugins_registry_dir",
        "--plugins-registry-dir",
        "DEVPLUG_PLUGINS_REGISTRY_DIR",
        Path("/var/lib/kubelet/plugins_registry"),
        "/pr",
        Path("/pr"),
    ),
    ("endpoint_host_dir", "--endpoint-host-dir", "DEVPLUG_ENDPOINT_HOST_DIR", None, "/h/pr", Path("/h/pr")),
    ("register_timeout", "--register-timeout", "DEVPLUG_REGISTER_TIMEOUT", 15.0, "3", 3.0),
    ("retry_initial", "--retry-initial", "DEVPLUG_RETRY_INITIAL", 0.05, "0.5", 0.5),
    ("retry_max", "--retry-max", "DEVPLUG_RETRY_MAX", 10.0, "7", 7.0),
    ("shutdown_grace", "--shutdown-grace", "DEVPLUG_SHUTDOWN_GRACE", 0.5, "2", 2.0),
    ("log_format", "--log-format", "DEVPLUG_LOG_FORMAT", "auto", "json", "json"),
    ("log_level", "--log-level", "DEVPLUG_LOG_LEVEL", "info", "debug", "debug"),
    ("metrics_address", "--metrics-address", "DEVPLUG_METRICS_ADDRESS", None, ":9400", ":9400"),
    ("config", "--config", "DEVPLUG_CONFIG", None, "{tmp}/empty.yaml", Path("{tmp}/empty.yaml")),
    ("cdi_dir", "--cdi-dir", "DEVPLUG_CDI_DIR", Path("/var/run/cdi"), "/cdi", Path("/cdi")),
    ("host_path_check", "--host-path-check", "DEVPLUG_HOST_PATH_CHECK", "warn", "refuse", "refuse"),
    ("host_root", "--host-root", "DEVPLUG_HOST_ROOT", Path("/"), "/host", Path("/host")),
    ("insecure_dir", "--insecure-dir", "DEVPLUG_INSECURE_DIR", "refuse", "warn", "warn"),
    ("driver_name", "--driver-name", "DEVPLUG_DRIVER_NAME", None, "gpu.example.com", "gpu.example.com"),
    ("node_name", "--node-name", "DEVPLUG_NODE_NAME", None, "node-a", "node-a"),
    ("kubeconfig", "--kubeconfig", "DEVPLUG_KUBECONFIG", None, "/kc", Path("/kc")),
    ("pod_uid", "--pod-uid", "DEVPLUG_POD_UID", None, "uid-1", "uid-1"),
    ("list_attributes", "--list-attributes", "DEVPLUG_LIST_ATTRIBUTES", False, "true", True),
    ("device_metadata", "--device-metadata", "DEVPLUG_DEVICE_METADATA", False, "true", True),
    (
        "device_metadata_versions",
        "--device-metadata-versions",
        "DEVPLUG_DEVICE_METADATA_VERSIONS",
        ("v1beta1", "v1alpha1"),
        '["v1beta1"]',
        ("v1beta1",),
    ),
    (
        "health",
        "--health",
        "DEVPLUG_HEALTH",
        HealthSettings(),
        '{"flap_limit": 2}',
        HealthSettings(flap_limit=2),
    ),
]
# The health policy's own flags (health.* in a config file).
HEALTH_FLAGS = [
    "--health.unhealthy-after",
    "--health.healthy-after",
    "--health.recovery-cooldown",
    "--health.unknown-timeout",
    "--health.result-ttl",
    "--health.flap-limit",
    "--health.flap-window",
    "--health.flap-hold",
]
INTERFACE_IDS = [row[0] for row in INTERFACE]


def _in_tmp(value: object, tmp: Path) -> object:
    if isinstance(value, str | Path):
        return type(value)(str(value).replace("{tmp}", str(tmp)))
    return value


@pytest.fixture
def _no_downward_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("POD_UID", raising=False)
    (tmp_path / "empty.yaml").write_text("")


def test_every_field_is_in_the_interface_table() -> None:
    assert sorted(Settings.model_fields) == sorted(INTERFACE_IDS)


@pytest.mark.usefixtures("_no_downward_api")
def test_defaults_as_recorded() -> None:
    settings = load_settings(Settings, [])
    assert {name: getattr(settings, name) for name in INTERFACE_IDS} == {row[0]: row[3] for row in INTERFACE}


@pytest.mark.usefixtures("_no_downward_api")
@pytest.mark.parametrize("row", INTERFACE, ids=INTERFACE_IDS)
def test_flag_environment_and_config_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, row: tuple[str, str, str, object, str, object]
) -> None:
    name, flag, env, _, typed, value = row
    typed, value = str(_in_tmp(typed, tmp_path)), _in_tmp(value, tmp_path)
    # A switch takes no value on the command line (--x / --no-x).
    argv = [flag] if isinstance(value, bool) and value else [flag, typed]
    assert getattr(load_settings(Settings, argv), name) == value
    if name != "config":  # the file that names itself is the one --config gives
        config = tmp_path / "c.json"
        config.write_text(json.dumps({name: json.loads(typed) if typed[:1] in "[{" else typed}))
        assert getattr(load_settings(Settings, ["--config", str(config)]), name) == value
    monkeypatch.setenv(env, typed)
    assert getattr(load_settings(Settings, []), name) == value


def _help_flags(cls: type[Settings], capsys: pytest.CaptureFixture[str]) -> set[str]:
    with pytest.raises(SystemExit):
        load_settings(cls, ["--help"], prog="p")
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9.-]*[a-z0-9]", capsys.readouterr().out))


@pytest.mark.parametrize("cls", [Settings, FakeSettings, NvidiaSettings], ids=lambda c: c.__name__)
def test_help_lists_every_flag(cls: type[Settings], capsys: pytest.CaptureFixture[str]) -> None:
    flags = _help_flags(cls, capsys)
    runner = {row[1] for row in INTERFACE} | set(HEALTH_FLAGS) | {"--help", "--version"}
    runner |= {f"--no-{row[1][2:]}" for row in INTERFACE if isinstance(row[3], bool)}
    assert runner <= flags
    if cls is Settings:
        assert flags == runner


@pytest.mark.usefixtures("_no_downward_api")
@pytest.mark.parametrize("cls", [FakeSettings, NvidiaSettings], ids=lambda c: c.__name__)
def test_backends_keep_the_runner_settings(cls: type[Settings]) -> None:
    defaults = load_settings(cls, [])
    assert {row[0]: getattr(defaults, row[0]) for row in INTERFACE} == {row[0]: row[3] for row in INTERFACE}
    argv = [
        part
        for row in INTERFACE
        if row[0] != "config"
        for part in ((row[1],) if isinstance(row[5], bool) else (row[1], row[4]))
    ]
    given = load_settings(cls, argv)
    assert {row[0]: getattr(given, row[0]) for row in INTERFACE if row[0] != "config"} == {
        row[0]: row[5] for row in INTERFACE if row[0] != "config"
    }


# -- the groups ----------------------------------------------------------------------------------


def test_every_setting_is_in_one_group() -> None:
    grouped = [name for group in GROUPS for name in fields_of(group)]
    assert sorted(grouped) == sorted(Settings.model_fields)
    assert list(Settings.model_fields) == grouped  # the fields follow the groups' order
    assert fields_of("kubelet")[:3] == ("kubelet_root", "device_plugin_dir", "kubelet_socket")
    assert (group_of("log_level"), group_of("health"), group_of("count")) == ("logging", "health", None)
    with pytest.raises(KeyError):
        fields_of("kubelets")


@pytest.mark.usefixtures("_no_downward_api")
def test_settings_is_each_group() -> None:
    settings = load_settings(Settings, ["--kubelet-root", "/k"])
    assert all(isinstance(settings, group) for group in GROUPS.values())
    assert (settings.dra_plugins_dir, settings.kubelet_socket_path) == (
        Path("/k/plugins"),
        Path("/k/device-plugins/kubelet.sock"),
    )
    # A group is a model of its own too, with its validators.
    assert KubeletGroup(kubelet_root=Path("/k")).plugins_registry_dir == Path("/k/plugins_registry")
    with pytest.raises(ValueError, match="must be greater than 0"):
        RegistrationGroup(retry_max=0)


@pytest.mark.parametrize("cls", [Settings, FakeSettings, NvidiaSettings], ids=lambda c: c.__name__)
def test_help_has_a_section_per_group(cls: type[Settings], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(cls, ["--help"], prog="p")
    text = capsys.readouterr().out
    titles = re.findall(r"^(\w+) options:$", text, re.MULTILINE)
    assert titles == list(GROUPS)
    for group in GROUPS:
        section = text.split(f"\n{group} options:\n", 1)[1].split(" options:\n", 1)[0]
        for name in fields_of(group):
            assert f"--{name.replace('_', '-')}" in section
    assert "default factory" not in text  # a Python function's name is no help
    if cls is FakeSettings:  # a backend's own options come first, under "options:"
        assert re.search(r"^options:\n(.*\n)*  --resource NAME", text.split("api options:")[0], re.MULTILINE)
