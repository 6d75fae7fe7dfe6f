"""Runner settings: command line > environment (``DEVPLUG_*``) > config file > defaults.

Backends subclass :class:`Settings` to add their own options; :func:`load_settings` parses any
subclass the same way. Every field's docstring is its ``--help`` text, read from the source only
when help is printed (:func:`describe_fields`).
"""

# No ``from __future__ import annotations`` here: pydantic would compile every field's annotation
# string when each class is made, milliseconds of every start (see bench/startup.py).

import argparse
import ast
import difflib
import inspect
import os
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict

from devplug._names import is_dns_subdomain
from devplug._version import version
from devplug.errors import ConfigError
from devplug.health import HealthSettings

__all__ = ["Settings", "describe_fields", "load_settings"]

S = TypeVar("S", bound="Settings")


class Settings(BaseSettings):
    """How a devplug process finds and talks to the kubelet."""

    model_config = SettingsConfigDict(
        env_prefix="DEVPLUG_",
        extra="forbid",
        frozen=True,
        # The schema is built when a class is first instantiated: a backend's subclass is, the
        # base class (25 fields) then never is, and a start does not build both.
        defer_build=True,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_hide_none_type=True,  # "--node-name str", not "{str,null}"
    )

    api: Literal["device-plugin", "dra"] = "device-plugin"
    """Which Kubernetes API serves the devices: device-plugin (extended resources through the
    kubelet's device manager) or dra (Dynamic Resource Allocation: ResourceSlices published
    through the API server, claims prepared for the kubelet; Kubernetes >= 1.32)."""
    kubelet_root: Path = Path("/var/lib/kubelet")
    """The kubelet's root directory; device-plugins/, plugins_registry/ and plugins/ are found
    under it unless given one by one (k3s: /var/lib/rancher/k3s/agent/kubelet)."""
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    """The kubelet's device-plugin directory (default: device-plugins under kubelet_root)."""
    kubelet_socket: Path | None = None
    """The kubelet's registration socket; default: kubelet.sock in the device-plugin directory."""
    registration: Literal["kubelet", "watcher"] = "kubelet"
    """kubelet: Register on kubelet.sock; watcher: a socket in the plugins_registry directory."""
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """The kubelet's plugin-watcher directory (registration=watcher, and api=dra); default:
    plugins_registry under kubelet_root."""
    endpoint_host_dir: Path | None = None
    """registration=watcher: the plugins_registry directory as the host sees it, when this process
    sees it at another path (a container mount); default: let the kubelet use the path it found."""
    register_timeout: float = 15.0
    """Seconds one Register call may take (kubelet >= 1.26 dials back within it, 10 s at most)."""
    retry_initial: float = 0.05
    """Seconds before the first Register retry; doubles per failure, jittered."""
    retry_max: float = 10.0
    """Cap, in seconds, of the delay between Register retries (retries never stop)."""
    shutdown_grace: float = 0.5
    """Seconds in-flight RPCs get to finish on shutdown or restart."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """auto: JSON when stderr (where logs go) is not a terminal, console otherwise."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    metrics_address: str | None = None
    """HOST:PORT (or :PORT for every interface) serving /metrics, /healthz, /readyz and
    /debug/state; off unless set (needs the metrics extra: pip install 'devplug[metrics]')."""
    config: Path | None = None
    """A YAML or JSON file of settings (field names as keys); flags and DEVPLUG_* override it."""
    cdi_dir: Path = Path("/var/run/cdi")
    """Where the CDI specs of plugins that define cdi_spec are written (runtimes read it)."""
    host_path_check: Literal["off", "warn", "refuse"] = "warn"
    """Host paths of the device nodes and mounts that Allocate answers (and, under DRA, the
    default prepare of a claim) that are missing: refuse fails the allocation or the claim with
    the path named, warn logs it, off checks nothing."""
    host_root: Path = Path("/")
    """Where this process sees the host's root filesystem (e.g. /host in a container); host
    paths are checked under it."""
    insecure_dir: Literal["refuse", "warn"] = "refuse"
    """A kubelet directory this process uses (device-plugin, plugins_registry, the kubelet
    socket's) that every user may write to, or that lies under such a directory without the
    sticky bit: anyone could then replace the kubelet's socket or this plugin's. refuse exits
    at start with one line (status 2) naming it; warn logs insecure_directory and starts."""
    driver_name: str | None = None
    """api=dra: the DRA driver name (a DNS subdomain, e.g. gpu.example.com), identical in
    ResourceSlices, DeviceClass selectors and claims; default: the resource name turned around
    (example.com/gpu -> gpu.example.com)."""
    node_name: str | None = Field(default_factory=lambda: os.environ.get("NODE_NAME") or None)
    """api=dra: this node's name, the owner and pool of the published ResourceSlices (default:
    the NODE_NAME environment variable, set from spec.nodeName through the downward API)."""
    kubeconfig: Path | None = None
    """api=dra: a kubeconfig file for the API server; default: the pod's service account
    (in-cluster), else $KUBECONFIG or ~/.kube/config."""
    pod_uid: str | None = Field(default_factory=lambda: os.environ.get("POD_UID") or None)
    """api=dra: this pod's UID (default: the POD_UID environment variable); when set, the
    sockets carry it, so an old and a new pod of a rolling update serve side by side."""
    health: HealthSettings = HealthSettings()
    """Health policy thresholds for plugins that use devplug.health (health: in a config file)."""

    @model_validator(mode="before")
    @classmethod
    def _under_kubelet_root(cls, data: Any) -> Any:
        # The kubelet's directories follow --kubelet-root unless they are given themselves.
        if isinstance(data, dict) and data.get("kubelet_root") is not None:
            root = Path(data["kubelet_root"])
            data = dict(data)
            data.setdefault("device_plugin_dir", root / "device-plugins")
            data.setdefault("plugins_registry_dir", root / "plugins_registry")
        return data

    @field_validator("register_timeout", "retry_initial", "retry_max", "shutdown_grace")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than 0")
        return value

    @field_validator("driver_name")
    @classmethod
    def _driver_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value, 63):
            raise ValueError(
                "a DRA driver name is a lowercase DNS subdomain of at most 63 characters "
                "(letters, digits, '-' and '.', e.g. gpu.example.com)"
            )
        return value

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value, 253):
            raise ValueError("a node name is a lowercase DNS subdomain of at most 253 characters")
        return value

    @field_validator("metrics_address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]*):\d{1,5}", value):
            raise ValueError("expected HOST:PORT, :PORT or [IPv6]:PORT")
        if value is not None and int(value.rpartition(":")[2]) > 65535:
            raise ValueError("port must be at most 65535")
        return value

    @property
    def dra_plugins_dir(self) -> Path:
        """``<kubelet_root>/plugins``: each DRA driver's socket and state live in a directory in it."""
        return self.kubelet_root / "plugins"

    @property
    def kubelet_socket_path(self) -> Path:
        return self.kubelet_socket or self.device_plugin_dir / "kubelet.sock"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def load_settings(cls: type[S], argv: list[str] | None = None, *, prog: str | None = None) -> S:
    """Build ``cls`` from the command line, the environment and the config file.

    ``argv`` defaults to ``sys.argv[1:]``; ``--help`` prints the options and exits 0, an unknown
    flag exits 2 with one line. Raises ConfigError (one line naming the field) for invalid values
    or an unreadable config file.
    """
    args = sys.argv[1:] if argv is None else argv
    if wants_help(args):
        describe_fields(cls)
    parser = _OneLineParser(prog=prog, description=(cls.__doc__ or "").strip())
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    cli: CliSettingsSource[Any] = CliSettingsSource(cls, root_parser=parser, cli_prog_name=prog)
    word_metavars(parser)  # before parsing: --help prints them
    cli_values: dict[str, Any] = cli(args=args)()
    config = cli_values.get("config") or os.environ.get("DEVPLUG_CONFIG")
    file_values = _read_config(Path(config)) if config else {}
    # Keyword arguments beat the environment inside BaseSettings, so a file value is passed
    # only where no DEVPLUG_* variable sets the field; the command line is passed as is.
    from_env = {name for name in cls.model_fields if f"DEVPLUG_{name}".upper() in os.environ}
    merged = {k: v for k, v in file_values.items() if k not in from_env} | cli_values
    try:
        return cls(**merged)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, model=cls)) from None


def wants_help(args: list[str]) -> bool:
    """``-h`` / ``--help`` among the arguments."""
    return any(arg in ("-h", "--help") for arg in args)


def describe_fields(model: type[BaseModel]) -> None:
    """Give each field of ``model`` (and of the models nested in it) the docstring under it as its
    description, the ``--help`` text; fields that have a description keep it.

    Read from the source when help is wanted, not when the class is made: pydantic's
    ``use_attribute_docstrings`` finds each class's source at class creation, which on Python
    < 3.13 walks the stack and resolves the path of every loaded module, tens of milliseconds of
    every start for text only ``--help`` prints.
    """
    seen: set[type[BaseModel]] = set()

    def visit(current: type[BaseModel]) -> None:
        if current in seen:
            return
        seen.add(current)
        docs: dict[str, str] = {}
        for klass in reversed(current.__mro__):
            # A subclass's docstring wins; pydantic's own classes (BaseModel, BaseSettings) have none.
            if issubclass(klass, BaseModel) and not klass.__module__.startswith("pydantic"):
                docs.update(_attribute_docstrings(klass))
        for name, field in current.model_fields.items():
            if field.description is None and name in docs:
                field.description = docs[name]
            nested = _model_in(field.annotation)
            if nested is not None:
                visit(nested)

    visit(model)


def _attribute_docstrings(klass: type) -> dict[str, str]:
    """The string statements right after annotated assignments in ``klass``'s own body."""
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):  # no source (an interactive session, a frozen module)
        return {}
    lines = source.splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())
    # A docstring may be less indented than the class (a nested class): parse inside a block.
    body = (" " + (line[indent:] if line[:indent].isspace() else line) for line in lines)
    wrapped = "if True:\n" + "\n".join(body)
    try:
        tree = ast.parse(wrapped)
    except SyntaxError:
        return {}
    block = tree.body[0]
    assert isinstance(block, ast.If)
    node = block.body[0]
    if not isinstance(node, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


# Placeholders in --help: words, as NVIDIA's and kubectl's flags show them, rather than the
# Python types pydantic-settings prints (Path, float, tuple[JSON,...]).
_METAVAR_BY_NAME = {
    "metrics_address": "HOST:PORT",
    "kubelet_socket": "SOCKET",
    "config": "FILE",
    "kubeconfig": "FILE",
    "state_file": "FILE",
    "driver_name": "NAME",
    "node_name": "NAME",
    "resource": "NAME",
    "pod_uid": "UID",
}
_METAVAR_BY_TYPE = {"Path": "PATH", "float": "SECONDS", "int": "N", "str": "VALUE"}


def word_metavars(parser: argparse.ArgumentParser) -> None:
    """Replace the type names pydantic-settings uses as placeholders with words (DIR, SECONDS...)."""
    for action in parser._actions:
        metavar = action.metavar
        if not isinstance(metavar, str) or metavar.startswith("{"):
            continue  # choices stay listed: {auto,json,console}
        name = action.dest.rpartition(".")[2]
        if name in _METAVAR_BY_NAME:
            action.metavar = _METAVAR_BY_NAME[name]
        elif metavar == "Path" and name.endswith(("_dir", "_root")):
            action.metavar = "DIR"
        elif metavar in _METAVAR_BY_TYPE:
            action.metavar = _METAVAR_BY_TYPE[metavar]
        elif metavar.startswith(("tuple[", "list[")):
            action.metavar = "JSON"


def keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys (a field's alias, else its name) of the model found at ``loc`` inside ``model``, as
    a validation error locates it (list items skipped); [] where ``loc`` leads to no model."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None:
            return []
        fields = {f.alias or n: f for n, f in current.model_fields.items()}
        field = fields.get(str(part)) or current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if current is None:
        return []
    return [f.alias or n for n, f in current.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def read_yaml(path: Path) -> Any:
    """The parsed content of a YAML (or JSON) config file.

    Raises ConfigError, one line naming the file (and the line, for a syntax error).
    """
    import yaml  # only a config file needs it: a start without one does not load PyYAML

    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path}{where}: not valid YAML or JSON") from None


def _read_config(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def describe_validation_error(exc: ValidationError, *, model: type[BaseModel] | None = None) -> str:
    """One line naming the first invalid field and why (the rest are counted).

    With ``model``, an unknown setting names the closest known one (a typo in a config file).
    """
    errors = exc.errors()
    first = errors[0]
    field = ".".join(str(part) for part in first["loc"]) or "settings"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown setting"
        if model is not None and first["loc"]:
            known = keys_at(model, first["loc"][:-1])
            close = difflib.get_close_matches(str(first["loc"][-1]), known, n=1)
            if close:
                message += f' (did you mean "{close[0]}"?)'
    text = f"invalid setting {field}: {message}"
    if first["type"] != "extra_forbidden" and "input" in first:
        text += f" (got {first['input']!r})"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text
