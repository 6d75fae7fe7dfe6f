"""The ``labels`` command: gpu-feature-discovery's node labels for Node Feature Discovery.

Writes the labels of :func:`node_labels` to the NFD features file, once (``--oneshot``) or every
``--sleep-interval``, with gpu-feature-discovery's flags, ``GFD_*`` environment variables, config
file keys (``flags.gfd.*``, ``flags.migStrategy``, ``sharing``) and defaults. Outside oneshot mode
the file is removed on SIGTERM / SIGINT, as upstream does, so a stopped labeller leaves no stale
labels. Run it as ``python -m devplug_nvidia.labels``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import structlog

from devplug._text import os_error_text
from devplug.errors import ConfigError, DevplugError
from devplug_nvidia._cli._fake_root import FakeRoots, model_names, require_model
from devplug_nvidia._config._file import read_config_file
from devplug_nvidia._gpu._nvml import NvmlError
from devplug_nvidia._labels._node_labels import (
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_OUTPUT_FILE,
    DEFAULT_SLEEP_INTERVAL,
    LabelSettings,
    arch_family,
    format_labels,
    machine_labels,
    node_labels,
    read_node_labels,
    sanitise,
    write_labels,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "DEFAULT_MACHINE_TYPE_FILE",
    "DEFAULT_OUTPUT_FILE",
    "DEFAULT_SLEEP_INTERVAL",
    "LabelSettings",
    "arch_family",
    "format_labels",
    "main",
    "node_labels",
    "parse_args",
    "parse_duration",
    "read_node_labels",
    "run",
    "sanitise",
    "write_labels",
]

log = structlog.get_logger(__name__)

PROG = "devplug-nvidia labels"


def _label_once(settings: LabelSettings) -> dict[str, str]:
    try:
        return read_node_labels(settings)
    except NvmlError:
        if settings.fail_on_init_error:
            raise
        log.warning(
            "nvml_unavailable_labels_reduced", note="only the machine labels are written", exc_info=True
        )
        return machine_labels(settings, None)


def _output(labels: Mapping[str, str], settings: LabelSettings) -> None:
    if settings.output_file:
        write_labels(labels, settings.output_file)
        log.info("labels_written", path=settings.output_file, labels=len(labels))
    else:
        sys.stdout.write(format_labels(labels))
        sys.stdout.flush()


async def run(settings: LabelSettings, *, runs: int | None = None) -> None:
    """Label now, then every ``sleep_interval`` until cancelled (or ``runs`` times; once with oneshot).

    NVML is read in a worker thread so the loop stays responsive to signals. Outside oneshot mode
    the features file is removed when the loop ends, as upstream does, so a stopped labeller
    leaves no stale labels.

    Raises:
        NvmlError: NVML failed and ``fail_on_init_error`` is set.
    """
    done = 0
    try:
        while True:
            await anyio.to_thread.run_sync(_label_and_output, settings)
            done += 1
            if settings.oneshot or (runs is not None and done >= runs):
                return
            await anyio.sleep(settings.sleep_interval)
    finally:
        if not settings.oneshot:
            _remove_output(settings)


def _label_and_output(settings: LabelSettings) -> None:
    _output(_label_once(settings), settings)


def _remove_output(settings: LabelSettings) -> None:
    if settings.output_file:
        Path(settings.output_file).unlink(missing_ok=True)
        log.info("labels_removed", path=settings.output_file)


async def _serve(settings: LabelSettings) -> None:
    """Run until done or until SIGTERM / SIGINT (a DaemonSet's stop); errors are raised unwrapped."""
    failure: BaseException | None = None
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:

            async def work() -> None:
                nonlocal failure
                try:
                    await run(settings)
                except (DevplugError, OSError) as exc:
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()

            tg.start_soon(work)
            async for signum in signals:
                log.info("signal_received", signal=signal.Signals(signum).name)
                break
            tg.cancel_scope.cancel()
    if failure is not None:
        raise failure


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A duration as gpu-feature-discovery takes it (Go syntax: ``60s``, ``1m30s``, ``500ms``) or
    plain seconds; returns seconds (> 0).

    Raises:
        ValueError: not a positive duration.
    """
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(value) or not value:
            raise ValueError(f"invalid duration {text!r} (e.g. 60s, 1m30s, 500ms)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"the duration must be greater than 0, got {text!r}")
    return seconds


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "t", "true", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# Flag → (environment variables, first found wins), as gpu-feature-discovery reads them.
_ENV = {
    "mig_strategy": ("GFD_MIG_STRATEGY", "MIG_STRATEGY"),
    "fail_on_init_error": ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"),
    "oneshot": ("GFD_ONESHOT",),
    "no_timestamp": ("GFD_NO_TIMESTAMP",),
    "sleep_interval": ("GFD_SLEEP_INTERVAL",),
    "output_file": ("GFD_OUTPUT_FILE",),
    "machine_type_file": ("GFD_MACHINE_TYPE_FILE",),
    "config_file": ("GFD_CONFIG_FILE", "CONFIG_FILE"),
    "driver_root": ("NVIDIA_DRIVER_ROOT",),
    "fake_nvml": ("DEVPLUG_FAKE_NVML",),
}


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=PROG, description="Write NVIDIA GPU node labels for Node Feature Discovery.")

    def add(*flags: str, **kwargs: Any) -> None:
        action = parser.add_argument(*flags, **kwargs)
        if action.dest in _ENV:  # the environment variables, as gpu-feature-discovery lists them
            action.help = f"{action.help} [{', '.join('$' + v for v in _ENV[action.dest])}]"

    flag: dict[str, Any] = {"type": _bool, "nargs": "?", "const": True, "metavar": "BOOL"}
    add(
        "--mig-strategy",
        choices=("none", "single", "mixed"),
        metavar="STRATEGY",
        help="how MIG devices are labelled: none, single or mixed (default none)",
    )
    add("--fail-on-init-error", **flag, help="exit if NVML fails (default true)")
    add("--oneshot", **flag, help="label once and exit")
    add("--no-timestamp", **flag, help="leave out nvidia.com/gfd.timestamp")
    add("--sleep-interval", type=_duration, metavar="DURATION", help="time between labelings (default 60s)")
    add(
        "--output-file",
        "--output",
        "-o",
        metavar="FILE",
        help=f"the features file (default {DEFAULT_OUTPUT_FILE}; '' prints)",
    )
    add(
        "--machine-type-file",
        metavar="FILE",
        help=f"the DMI product name file (default {DEFAULT_MACHINE_TYPE_FILE}, under the driver root "
        "with --fake-nvml)",
    )
    add(
        "--config-file",
        metavar="FILE",
        help="the NVIDIA config file (v1): flags.migStrategy, flags.gfd.*, sharing",
    )
    add(
        "--driver-root",
        "--nvidia-driver-root",
        metavar="PATH",
        help="root of the NVIDIA driver installation (default /)",
    )
    add(
        "--fake-nvml",
        metavar="MODEL",
        help=f"label a fake NVML machine model (testing): {', '.join(model_names())}; without "
        "--driver-root its /sys, /proc and driver tree is laid out in a temporary directory, "
        "removed at exit",
    )
    return parser


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LabelSettings:
    """Flags > environment > config file > defaults, as gpu-feature-discovery.

    With a fake NVML model, the machine type file defaults to the one under the driver root
    (where :func:`devplug_nvidia.testing.write_root` puts it), as /sys and /proc do.

    Raises:
        ConfigError: a bad flag, value or config file (one line).
    """
    return _parse(argv, environ)[0]


def _parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[LabelSettings, set[str]]:
    """:func:`parse_args`, and the names of the settings given (by flag, environment or config file)."""
    env = os.environ if environ is None else environ
    parser = _parser()
    given = {k: v for k, v in vars(parser.parse_args(list(argv))).items() if v is not None}
    for name, variables in _ENV.items():
        if name in given:
            continue
        raw = next((env[v] for v in variables if v in env), None)
        if raw is None:
            continue
        action = next(a for a in parser._actions if a.dest == name)
        try:
            given[name] = action.type(raw) if callable(action.type) else raw
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{variables[0]}: {exc}") from None
        if action.choices is not None and given[name] not in action.choices:
            raise ConfigError(
                f"{variables[0]}: invalid choice {raw!r} (choose from {', '.join(action.choices)})"
            )
    values: dict[str, Any] = {}
    config_file = given.pop("config_file", None)
    if config_file:
        values |= _file_values(Path(config_file))
    values |= given
    explicit = set(values)
    if values.get("fake_nvml") and "machine_type_file" not in values:
        values["machine_type_file"] = _under(values.get("driver_root", "/"), DEFAULT_MACHINE_TYPE_FILE)
    try:
        return replace(LabelSettings(), **values), explicit
    except TypeError as exc:  # pragma: no cover - the parser only produces known fields
        raise ConfigError(str(exc)) from None


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _on_fake_root(settings: LabelSettings, explicit: set[str], roots: FakeRoots) -> LabelSettings:
    """A fake model with no driver root given: the driver root (and the machine type file, unless
    given) in the model's temporary tree."""
    if not settings.fake_nvml or "driver_root" in explicit:
        return settings
    root = roots.root(settings.fake_nvml)
    machine = settings.machine_type_file
    if "machine_type_file" not in explicit:
        machine = _under(str(root), DEFAULT_MACHINE_TYPE_FILE)
    return replace(settings, driver_root=str(root), machine_type_file=machine)


def _file_values(path: Path) -> dict[str, Any]:
    parsed = read_config_file(path)  # ConfigError on a bad file
    values: dict[str, Any] = {"sharing": parsed.sharing}
    flags = parsed.flags
    if flags.mig_strategy is not None:
        values["mig_strategy"] = flags.mig_strategy
    if flags.fail_on_init_error is not None:
        values["fail_on_init_error"] = flags.fail_on_init_error
    if flags.nvidia_driver_root is not None:
        values["driver_root"] = flags.nvidia_driver_root
    gfd = flags.gfd
    if gfd is not None:
        for name in ("oneshot", "no_timestamp", "output_file", "machine_type_file"):
            if (value := getattr(gfd, name)) is not None:
                values[name] = value
        if gfd.sleep_interval is not None:
            try:
                values["sleep_interval"] = parse_duration(gfd.sleep_interval)
            except ValueError as exc:
                raise ConfigError(f"config file {path}: invalid flags.gfd.sleepInterval: {exc}") from None
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """The labels command; returns the exit status (2: bad flags or config, 1: NVML or write failed).

    ``--fake-nvml MODEL`` without a driver root labels the model on its own tree, laid out in a
    temporary directory that is removed when the command ends.
    """
    from devplug.logging import configure as configure_logging

    try:
        settings, explicit = _parse(sys.argv[1:] if argv is None else argv)
        if settings.fake_nvml:
            require_model(settings.fake_nvml)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    with FakeRoots() as roots:
        settings = _on_fake_root(settings, explicit, roots)
        configure_logging()
        roots.log_trees()
        try:
            anyio.run(_serve, settings)
        except DevplugError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"{PROG}: {os_error_text(exc)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
