"""The ``devplug-nvidia`` process: settings, discovery, CDI spec, one server per resource."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

import devplug
from devplug.errors import ConfigError, DevplugError
from devplug.logging import configure as configure_logging
from devplug_nvidia._allocate import imex_channels, present_nodes
from devplug_nvidia.config import NvidiaSettings, load_nvidia_settings

if TYPE_CHECKING:
    from devplug_nvidia._model import GpuRecord

__all__ = ["main"]

PROG = "devplug-nvidia"
log = structlog.get_logger("devplug_nvidia")


class InitError(DevplugError):
    """NVML (or discovery) could not start; the message says what to check."""


def discover_records(config: NvidiaSettings) -> dict[str, list[GpuRecord]]:
    """Resource name → records, from :func:`devplug_nvidia.discovery.discover`.

    Raises:
        InitError: discovery is unavailable or NVML failed to start.
        ConfigError: the configuration does not fit the machine (e.g. MIG single strategy errors).
    """
    try:
        from devplug_nvidia.discovery import discover
    except ImportError as exc:
        raise InitError(f"device discovery is not available: {exc}") from None
    try:
        return discover(config)
    except ConfigError:
        raise
    except DevplugError as exc:
        raise InitError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    """Run the plugin; returns the exit status (2: bad configuration, 1: init failure)."""
    try:
        settings = load_nvidia_settings(argv, prog=PROG)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    try:
        by_resource = discover_records(settings)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except InitError as exc:
        if settings.fail_on_init_error:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        # Upstream blocks forever here; say why once and advertise nothing.
        log.warning("init_failed_idle", reason=str(exc), advertising="nothing", fail_on_init_error=False)
        by_resource = {}
    dev_view = Path(settings.effective_dev_root)
    present = present_nodes(dev_view)
    try:
        imex = imex_channels(settings.imex_channel_ids, dev_view, required=settings.imex_required)
    except FileNotFoundError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if settings.any_cdi:
        from devplug_nvidia._cdi import write_cdi_spec

        records = [r for rs in by_resource.values() for r in rs]
        for path in write_cdi_spec(records, settings, present=present, imex=imex):
            log.info("cdi_spec_written", path=str(path))
    from devplug_nvidia.plugin import NvidiaPlugin

    plugins = [
        NvidiaPlugin(name, records, settings, present=present, imex=imex)
        for name, records in sorted(by_resource.items())
        if records
    ]
    if not plugins:
        log.warning("no_devices", note="serving no resources")
    return devplug.run(plugins, settings)
