"""The ``devplug-nvidia`` process: settings, discovery, sharing, CDI spec, one health monitor,
one server per resource."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import structlog

import devplug
from devplug import install_signals, run_async
from devplug._extras import require_dra
from devplug._settings_groups import BOTH_APIS
from devplug._text import os_error_text
from devplug._version import version
from devplug.errors import ConfigError, DevplugError, config_error_in
from devplug.logging import configure as configure_logging
from devplug.metrics import require_prometheus
from devplug_nvidia._cli._fake_root import FakeRoots, with_fake_root
from devplug_nvidia._cli._help import wants_help, wants_version
from devplug_nvidia._container._allocate import imex_channels, present_nodes
from devplug_nvidia._device_plugin._sharing import apply_sharing
from devplug_nvidia.config import NvidiaSettings, load_nvidia_settings
from devplug_nvidia.discovery import GPU_RESOURCE, InitStatus, discover_or_idle, nvml_source

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from devplug import DevicePlugin
    from devplug_nvidia._container._allocate import ImexChannel
    from devplug_nvidia._device_plugin._sharing import SharedResource
    from devplug_nvidia._gpu._health import HealthMonitor
    from devplug_nvidia._gpu._links import LinkMatrix
    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia.plugin import NvidiaPlugin

__all__ = ["main"]

PROG = "devplug-nvidia"
log = structlog.get_logger("devplug_nvidia")
STATUS = InitStatus()
"""Whether start-up found the devices, and why not: what a readiness check reports."""


def main(argv: list[str] | None = None) -> int:
    """Run the plugin (or ``labels``, or ``fake-root``); returns the exit status (2: bad
    configuration, 1: init failure)."""
    install_signals(PROG)  # first: a SIGTERM / Ctrl-C from here on never ends in a traceback
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["labels"], ["fake-root"]) and wants_version(args[1:]) and not wants_help(args[1:]):
        print(f"{PROG} {args[0]} {version()}")
        return 0
    if args[:1] == ["labels"]:
        from devplug_nvidia import labels

        return labels.main(args[1:])
    if args[:1] == ["fake-root"]:
        from devplug_nvidia._cli import _fake_root

        return _fake_root.main(args[1:])
    if wants_help(args):
        from devplug_nvidia._cli._help import help_text

        print(help_text(PROG), end="")
        return 0
    # --fake-nvml without a driver root: the model's tree in a temporary directory, removed
    # however the run ends.
    with FakeRoots() as roots:
        return _run(args, roots)


def _load(args: list[str], roots: FakeRoots) -> NvidiaSettings:
    settings = with_fake_root(load_nvidia_settings(args, prog=PROG), roots)
    # The fake tree's own SIGTERM handler gives way to the process's, which unwinds the same
    # way (so the tree goes) with the status of an interrupted start.
    install_signals(PROG)
    return settings


def _run(args: list[str], roots: FakeRoots) -> int:
    try:
        settings = _load(args, roots)
        if settings.metrics_address:
            require_prometheus()
        configure_logging(settings.log_format, settings.log_level)
        if settings.api != "device-plugin":
            require_dra()
            from devplug_nvidia.dra import run_dra

            both = settings.api == BOTH_APIS
            return run_both(settings, roots) if both else run_dra(settings, PROG, started=roots.log_trees)
        plugins, monitor = prepare(settings)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except DevplugError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. an unwritable --cdi-dir: one line, exit 1
        print(f"{PROG}: {os_error_text(exc)}", file=sys.stderr)
        return 1
    roots.log_trees()  # after start-up, whose errors are one line
    if not plugins:
        log.warning("no_devices", note="serving no resources")

    def reload() -> tuple[NvidiaSettings, list[NvidiaPlugin]]:
        # SIGHUP: the same arguments, the config file and environment read again, discovery
        # and sharing redone; the health monitor keeps watching. A bad config raises, and the
        # runner keeps serving the old one.
        new_settings = _load(args, roots)
        return new_settings, prepare(new_settings, monitor=monitor)[0]

    return _served(partial(serve, plugins, settings, monitor, reload=reload))


def _served(serving: Callable[[], Awaitable[None]]) -> int:
    """Run ``serving`` until SIGTERM: 0, or 2 when the runner refuses to start (an insecure
    directory, a metrics port in use) with a ConfigError, which the health monitor's task group
    wraps in an exception group."""
    try:
        run_async(serving)
    except Exception as exc:
        refusal = config_error_in(exc)
        if refusal is None:
            raise
        print(f"{PROG}: {refusal}", file=sys.stderr)
        return 2
    return 0


def run_both(settings: NvidiaSettings, roots: FakeRoots) -> int:
    """``--api device-plugin,dra``: the device plugin's resources (MIG strategy, sharing, as
    without DRA) and the DRA driver ``gpu.nvidia.com`` from one process, with one ledger of who
    holds which GPU (the two sides' devices match by UUID). No reload on SIGHUP: the two sides'
    plugins come from two discoveries.

    Raises:
        ConfigError, DevplugError, OSError: as a start of either API alone (the caller says so).
    """
    from devplug_nvidia.dra import NvidiaDraPlugin, serving_settings

    settings = serving_settings(settings)
    dra_plugin = NvidiaDraPlugin.from_settings(settings)
    plugins, monitor = prepare(settings)
    roots.log_trees()
    return _served(partial(serve_both, plugins, dra_plugin, settings, monitor))


async def serve_both(
    plugins: Sequence[NvidiaPlugin],
    dra_plugin: DevicePlugin,
    settings: NvidiaSettings,
    monitor: HealthMonitor | None,
) -> None:
    """Serve ``plugins`` through the device-plugin API and ``dra_plugin`` as the DRA driver
    until SIGTERM / SIGINT, the health monitor beside them."""
    from devplug.dra import DualHost

    async with anyio.create_task_group() as tg:
        if monitor is not None:
            tg.start_soon(monitor.run)
        host = DualHost(plugins, settings, dra_plugins=[dra_plugin], readiness=[init_readiness])
        await host.run()
        tg.cancel_scope.cancel()


def prepare(
    settings: NvidiaSettings, *, monitor: HealthMonitor | None = None
) -> tuple[list[NvidiaPlugin], HealthMonitor | None]:
    """Discovery, sharing, the CDI spec, the health monitor and the link matrix: the plugins to serve.

    Raises:
        ConfigError: the configuration does not fit the machine (exit 2).
        DevplugError: NVML failed and fail-on-init-error is true (exit 1).
        DevplugError: the CDI spec cannot be written (exit 1).
        OSError: a required IMEX channel is missing (exit 1).
    """
    # fail-on-init-error=false: an NVML failure leaves STATUS not ready with the reason, logged
    # once, and nothing advertised (upstream blocks silently instead).
    by_resource = discover_or_idle(settings, STATUS)
    dev_view = Path(settings.effective_dev_root)
    present = present_nodes(dev_view)
    imex = imex_channels(settings.imex_channel_ids, dev_view, required=settings.imex_required)
    resources = apply_sharing(by_resource, settings.sharing)
    records = [r for rs in by_resource.values() for r in rs]
    if settings.any_cdi:
        from devplug_nvidia._container._cdi import write_cdi_spec

        try:
            for path in write_cdi_spec(records, settings, present=present, imex=imex):
                log.info("cdi_spec_written", path=str(path))
        except OSError as exc:
            raise DevplugError(os_error_text(exc, "write the CDI spec")) from None
    if monitor is None:
        monitor = health_monitor(settings, records)
    links = read_link_matrix(settings) if by_resource.get(GPU_RESOURCE) else None
    plugins = build_plugins(resources, settings, present=present, imex=imex, health=monitor, links=links)
    return plugins, monitor


def health_monitor(settings: NvidiaSettings, records: Sequence[GpuRecord]) -> HealthMonitor | None:
    """The process's health monitor over every discovered record (None when there are none).

    ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` and the config file's ``health``
    section decide which events and XIDs count; the quiet period
    before a recoverable XID's device is Healthy again is ``--health.recovery-cooldown``.
    """
    if not records:
        return None
    from devplug_nvidia._gpu._health import HealthMonitor
    from devplug_nvidia._gpu._xids import XidFilter

    source = nvml_source(settings)
    return HealthMonitor(
        records,
        module=source.module,
        driver_root=source.driver_root,  # in a container: where the host's driver root is mounted
        settings=settings.health,
        # health_config: the config file's health section (None where the settings lack it).
        xids=XidFilter.from_config(getattr(settings, "health_config", None), os.environ),
    )


def read_link_matrix(settings: NvidiaSettings) -> LinkMatrix | None:
    """The GPUs' link matrix, read once at start-up for preferred allocation (None if NVML fails:
    allocation then goes by NUMA locality, and says why in the log)."""
    from devplug_nvidia._gpu._links import read_links

    try:
        with nvml_source(settings).open() as nvml:
            return read_links(nvml)
    except DevplugError as exc:
        log.warning("link_matrix_unavailable", error=str(exc))
        return None


def build_plugins(
    resources: Mapping[str, SharedResource],
    settings: NvidiaSettings,
    *,
    present: frozenset[str],
    imex: Sequence[ImexChannel],
    health: HealthMonitor | None = None,
    links: LinkMatrix | None = None,
) -> list[NvidiaPlugin]:
    """One plugin per served resource (after sharing and renames), by name."""
    from devplug_nvidia._gpu._mps import MpsDaemon
    from devplug_nvidia.plugin import NvidiaPlugin

    plugins = []
    for name, resource in sorted(resources.items()):
        if not resource.records:
            continue
        mps = None
        if resource.strategy == "mps" and resource.shared and settings.mps_root:
            mps = MpsDaemon.for_resource(name, settings.mps_root, settings.host_root)
        plugins.append(
            NvidiaPlugin.for_resource(
                resource, settings, present=present, imex=imex, health=health, mps=mps, links=links
            )
        )
    return plugins


async def serve(
    plugins: Sequence[NvidiaPlugin],
    settings: NvidiaSettings,
    monitor: HealthMonitor | None,
    *,
    reload: Callable[[], tuple[NvidiaSettings, list[NvidiaPlugin]]] | None = None,
) -> None:
    """Serve ``plugins`` until SIGTERM / SIGINT, with ``monitor`` running next to them;
    SIGHUP calls ``reload``."""
    async with anyio.create_task_group() as tg:
        if monitor is not None:
            tg.start_soon(monitor.run)
        await devplug.serve(plugins, settings, readiness=[init_readiness], reload=reload)
        tg.cancel_scope.cancel()


def init_readiness() -> str | None:
    """``/readyz``'s condition for start-up: not ready, with the reason, while STATUS says so
    (fail-on-init-error=false after an NVML failure: up, advertising nothing)."""
    if STATUS.ready:
        return None
    return f"device discovery failed: {STATUS.reason}" if STATUS.reason else "device discovery has not run"
