"""Runner settings: command line > environment (``DEVPLUG_*``) > config file > defaults.

The fields come in groups (:data:`GROUPS`: api, kubelet, registration, serving, logging, metrics,
config, cdi, host, dra, health), one model each; :class:`Settings` inherits them all, so a field
keeps one flat name as flag, ``DEVPLUG_*`` variable, config-file key and attribute, and ``--help``
shows a section per group. :func:`fields_of` names a group's fields.

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
import json
import os
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict, SettingsError

from devplug import _settings_groups as _groups
from devplug._settings_groups import GROUPS, SettingsGroup, fields_of, group_of
from devplug._text import os_error_text
from devplug._version import version
from devplug.errors import ConfigError

__all__ = [
    "GROUPS",
    "Settings",
    "SettingsGroup",
    "describe_fields",
    "fields_of",
    "group_of",
    "load_settings",
]

S = TypeVar("S", bound="Settings")


# pydantic orders the fields of a class with several bases from the last base to the first: the
# groups are listed backwards so that the fields (and the usage line of --help) follow GROUPS.
class Settings(
    _groups.HealthGroup,
    _groups.DraGroup,
    _groups.HostGroup,
    _groups.CdiGroup,
    _groups.ConfigGroup,
    _groups.MetricsGroup,
    _groups.LoggingGroup,
    _groups.ServingGroup,
    _groups.RegistrationGroup,
    _groups.KubeletGroup,
    _groups.ApiGroup,
    BaseSettings,
):
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

    @classmethod
    def environment_names(cls, field: str) -> tuple[str, ...]:
        """The environment variables that set ``field``, the first found winning; a subclass that
        reads others (devplug-nvidia's MIG_STRATEGY) names them, so that an error names the
        variable the user set."""
        # node_name and pod_uid default to the downward API's variables.
        fallback = {"node_name": ("NODE_NAME",), "pod_uid": ("POD_UID",)}.get(field, ())
        return (f"DEVPLUG_{field.upper()}", *fallback)


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
    lay_out_help(parser)  # before parsing: --help prints it
    try:
        cli_values: dict[str, Any] = cli(args=args)()
    except SettingsError as exc:
        raise ConfigError(_unparsed(args, exc)) from None
    config = cli_values.get("config") or os.environ.get("DEVPLUG_CONFIG")
    file_values = _read_config(Path(config)) if config else {}
    # Keyword arguments beat the environment inside BaseSettings, so a file value is passed
    # only where no DEVPLUG_* variable sets the field; the command line is passed as is.
    from_env = {name for name in cls.model_fields if f"DEVPLUG_{name}".upper() in os.environ}
    merged = {k: v for k, v in file_values.items() if k not in from_env} | cli_values
    for warning in misspelled_variables(cls, os.environ):
        print(f"{prog or cls.__name__}: warning: {warning}", file=sys.stderr)

    def spelled(loc: Sequence[int | str]) -> str:
        # Named as the user wrote it: a key of the file, a variable, else the flag.
        top = str(loc[0])
        if top in cli_values:
            return flag_name(loc)
        names = cls.environment_names(top) if top in cls.model_fields else ()
        variable = next((v for v in names if v in os.environ), None)
        if variable is not None:
            rest = ".".join(str(part) for part in loc[1:])
            return variable + (f" ({rest})" if rest else "")
        if top in file_values:
            return ".".join(str(part) for part in loc)
        return flag_name(loc)

    try:
        return cls(**merged)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, model=cls, spelled=spelled)) from None
    except SettingsError as exc:  # a DEVPLUG_* variable's JSON that does not parse
        raise ConfigError(f"invalid setting: {exc}") from None


def _unparsed(args: Sequence[str], exc: SettingsError) -> str:
    """One line for a command-line value the parser could not read (a JSON list or object),
    naming its flag where one of ``args`` is such a value that is not JSON."""
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if not value and i + 1 < len(args):
            value = args[i + 1]
        if not flag.startswith("--") or not value.lstrip().startswith(("[", "{")):
            continue
        try:
            json.loads(value)
        except ValueError:
            return f"invalid setting {flag}: {value!r} is not valid JSON ({exc})"
    return f"invalid command line: {exc}"


def flag_name(loc: Sequence[int | str]) -> str:
    """The command-line flag of the setting at ``loc`` (``("health", "flap_limit")`` →
    ``--health.flap-limit``); list items are skipped."""
    return "--" + ".".join(str(part).replace("_", "-") for part in loc if not isinstance(part, int))


def misspelled_variables(cls: type[BaseModel], environ: typing.Mapping[str, str]) -> list[str]:
    """A line for each ``DEVPLUG_*`` variable that names no setting of ``cls`` but comes close to
    one, as a config-file key would be told (did you mean ...?).

    A warning, where an unknown config-file key is refused: the environment is shared by every
    program a shell starts, and a variable meant for another (devplug-fake's DEVPLUG_RESOURCE, a
    test runner's own) is no mistake; a near miss of one of this program's names is one.
    """
    known = [name.upper() for name in cls.model_fields]
    lines = []
    for variable in sorted(environ):
        prefix, _, name = variable.upper().partition("_")
        if prefix != "DEVPLUG" or not name or name in known:
            continue
        # Compared without the prefix, which every name shares and which would make any two close.
        # 0.85: a letter left out, doubled or swapped; not another word that shares a suffix
        # (the tests' DEVPLUG_E2E_REQUIRED is 0.8 from devplug-nvidia's IMEX_REQUIRED).
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            lines.append(f'unknown setting {variable} (did you mean "DEVPLUG_{close[0]}"?), ignored')
    return lines


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
        name = action.dest.rpartition(".")[2]
        if name == "api":  # its choices would read {device-plugin,dra,device-plugin,dra}; the help names them
            action.metavar = "API"
            continue
        if not isinstance(metavar, str) or metavar.startswith("{"):
            continue  # choices stay listed: {auto,json,console}
        if name in _METAVAR_BY_NAME:
            action.metavar = _METAVAR_BY_NAME[name]
        elif metavar == "Path" and name.endswith(("_dir", "_root")):
            action.metavar = "DIR"
        elif metavar in _METAVAR_BY_TYPE:
            action.metavar = _METAVAR_BY_TYPE[metavar]
        elif metavar.startswith(("tuple[", "list[")):
            action.metavar = "JSON"


def lay_out_help(parser: argparse.ArgumentParser) -> None:
    """The ``--help`` of a parser pydantic-settings filled from a :class:`Settings` class: word
    placeholders (:func:`word_metavars`), a section per group of :data:`GROUPS`, and each
    default shown once, in words (:func:`tidy_help`)."""
    word_metavars(parser)
    group_sections(parser)
    for action in parser._actions:
        if isinstance(action.help, str) and action.help != argparse.SUPPRESS:
            action.help = tidy_help(action.help)


# What pydantic-settings appends to a field's help: "(default: X)" or "(default factory: f)".
_APPENDED_DEFAULT = re.compile(r" ?\(default(?: factory)?: (?:[^()]|\([^()]*\))*\)$")
# Defaults that say nothing to a user: an unset value, an empty collection.
_EMPTY_DEFAULTS = {"null", "None", "{}", "()", "[]", "''"}
# pydantic-settings' help of a nested model's flag (--health): a JSON object of its fields.
_MODEL_JSON_HELP = re.compile(r"^set (\S+) from JSON string")


def tidy_help(text: str) -> str:
    """One option's help text, with the default pydantic-settings appended dropped where it
    would mislead or repeat: a default factory (names a Python function), an unset or empty
    default (null, None, {}), and any default when the text already says what the default is.
    The help of a nested model's flag says what the JSON holds."""
    nested = _MODEL_JSON_HELP.match(text)
    if nested:
        name = nested.group(1).lstrip("-")
        return f"All of {name} as one JSON object ({name}: in a config file); {name}.* flags set one each."
    found = _APPENDED_DEFAULT.search(text)
    if found is None:
        return text
    body = text[: found.start()]
    shown = found.group().strip()
    value = shown.removeprefix("(default: ").removesuffix(")")
    if "factory" in shown or value in _EMPTY_DEFAULTS or re.search(r"\bdefault:", body, re.IGNORECASE):
        return body
    return text


def group_sections(parser: argparse.ArgumentParser) -> None:
    """Move the runner's options out of "options:" into a section per group (``kubelet options:``
    ...), in the order of :data:`GROUPS`; a backend's own options stay under "options:", first."""
    optionals = parser._optionals
    titled = {section.title: section for section in parser._action_groups}
    sections: list[argparse._ArgumentGroup] = []
    for name, group in GROUPS.items():
        moved = [action for action in optionals._group_actions if action.dest in group.model_fields]
        # A nested model (health) has its section already, made by pydantic-settings.
        section = titled.get(f"{name} options")
        if section is None and moved:
            section = parser.add_argument_group(f"{name} options", description=group.__doc__)
        if section is None:
            continue
        for action in moved:
            optionals._group_actions.remove(action)
            section._group_actions.append(action)
        sections.append(section)
    others = [section for section in parser._action_groups if section not in sections]
    # argparse makes "positional arguments" and "options" first; the groups follow them.
    parser._action_groups[:] = [*others[:2], *sections, *others[2:]]


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
        raise ConfigError(os_error_text(exc, f"read the config file {path}")) from None
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


def describe_validation_error(
    exc: ValidationError,
    *,
    model: type[BaseModel] | None = None,
    spelled: typing.Callable[[Sequence[int | str]], str] | None = None,
) -> str:
    """One line naming the first invalid field and why (the rest are counted).

    With ``model``, an unknown setting names the closest known one (a typo in a config file).
    ``spelled`` names the field at a location as the user wrote it (a flag, a variable, a key);
    by default its location, dotted.
    """
    errors = exc.errors()
    first = errors[0]
    if spelled is not None and first["loc"]:
        field = spelled(first["loc"])
    else:
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
