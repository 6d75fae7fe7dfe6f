"""``devplug-nvidia --help``: the options with placeholders as NVIDIA's and kubectl's read, and
the sub-commands.

The options are the ones :func:`devplug_nvidia.load_nvidia_settings` parses (pydantic-settings
builds them from :class:`~devplug_nvidia.config.NvidiaSettings`); their generated placeholders
spell Python types (``{str,null}``, ``tuple[int,...]``), so the NVIDIA options get nouns here
(``--device-list-strategy STRATEGY[,STRATEGY]``, ``--fake-nvml MODEL``) and defaults as they are
typed on a command line.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from pydantic_settings import CliSettingsSource

from devplug._version import version
from devplug.settings import Settings, describe_fields, lay_out_help, wants_help
from devplug_nvidia._cli._fake_root import model_names, models_help
from devplug_nvidia.config import NvidiaSettings

__all__ = ["METAVARS", "help_text", "wants_help", "wants_version"]

METAVARS = {
    "mig_strategy": "STRATEGY",
    "driver_root": "PATH",
    "dev_root": "PATH",
    "device_list_strategy": "STRATEGY[,STRATEGY]",
    "device_id_strategy": "STRATEGY",
    "config_file": "FILE",
    "cdi_annotation_prefix": "PREFIX",
    "nvidia_cdi_hook_path": "PATH",
    "driver_root_ctr_path": "PATH",
    "mps_root": "PATH",
    "device_discovery_strategy": "STRATEGY",
    "imex_channel_ids": "ID[,ID]",
    "cdi_feature_flags": "FLAG[,FLAG]",
    "shared_devices_allocation_policy": "POLICY",
    "fake_nvml": "MODEL",
    "additional_xids_to_ignore": "XID[,XID]",
    "feature_gates": "GATE=BOOL[,GATE=BOOL]",
    "consumable_shares": "MODE",
    "metrics_path": "PATH",
    "service_account_name": "NAME",
    "image_pull_secrets": "NAME[,NAME]",
    "image_pull_policy": "POLICY",
}
"""Placeholders of devplug-nvidia's own options (the choices are listed in their help)."""

_TUPLE = re.compile(r"tuple\[(.+),\.\.\.\]")

_USAGE = """%(prog)s [OPTIONS]
       %(prog)s labels [OPTIONS]
       %(prog)s fake-root MODEL DIR
       %(prog)s [labels | fake-root] --version"""

_COMMANDS = """commands:
  labels [OPTIONS]     write gpu-feature-discovery's node labels for Node Feature
                       Discovery, once or every interval (labels --help)
  fake-root MODEL DIR  write a fake NVML model's /sys, /proc, /dev and driver tree
                       to DIR, to keep, and print the flags that run on it

fake NVML machine models (--fake-nvml MODEL, fake-root MODEL DIR):
"""


def wants_version(args: list[str]) -> bool:
    """``--version`` among the arguments."""
    return "--version" in args


def _default(value: Any) -> str | None:
    if value is None or value == "":
        return None  # the option's help says what unset (or empty) means
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _own_help(name: str) -> str:
    field = NvidiaSettings.model_fields[name]
    text = " ".join((field.description or "").split())
    if name == "fake_nvml":
        text += (
            f" One of: {', '.join(model_names())}. Unless --driver-root is given, the model's /sys, "
            "/proc, /dev and driver tree is laid out in a temporary directory for the run (removed "
            "at exit); fake-root MODEL DIR writes one to keep."
        )
    default = _default(field.default)
    if default is not None:
        text += f" (default: {default})"
    return text.replace("%", "%%")


def help_text(prog: str) -> str:
    """The whole ``--help`` text of ``prog`` (devplug-nvidia)."""
    describe_fields(NvidiaSettings)
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=_USAGE,
        description=(NvidiaSettings.__doc__ or "").strip(),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    CliSettingsSource(NvidiaSettings, root_parser=parser, cli_hide_none_type=True)
    own = NvidiaSettings.model_fields.keys() - Settings.model_fields.keys()
    for action in parser._actions:
        if action.dest in METAVARS:
            action.metavar = METAVARS[action.dest]
        elif isinstance(action.metavar, str) and (repeated := _TUPLE.fullmatch(action.metavar)):
            action.metavar = f"{repeated[1]}[,{repeated[1]}]"  # an option not named above
        if action.dest in own and action.help != argparse.SUPPRESS:
            action.help = _own_help(action.dest)
    lay_out_help(parser)  # the runner's options: DIR, SECONDS, HOST:PORT..., in their groups
    # The epilog goes after as it is: argparse would refill its lines.
    return f"{parser.format_help()}\n{_COMMANDS}{models_help()}\n"
