"""The process that hosts services: signals, probes, the kubelet-directory watch, readiness,
history, reload and shutdown, once for whatever API is served.

::

    Host.run ─► services opened (ConfigError: one line, nothing served)
             ─► probes bound ─► directory watch ─► each service started ─► serving
    SIGHUP ──► settings and plugins read again ─► each service applies what concerns it
    SIGTERM ─► every service stopped, sockets removed, probes closed

A service (:class:`Service`) is the part one Kubernetes API needs: the device-plugin service
(``devplug._device_plugin``) and the DRA one (``devplug._dra``). It contributes its readiness,
its part of ``/debug/state``, its metrics collectors and its settings bound at start through one
interface; the host knows nothing else of it, and one host can serve several.
"""

from __future__ import annotations

import datetime
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import structlog

from devplug._runtime.backoff import Backoff
from devplug._runtime.signals import until_signalled
from devplug._runtime.watch import DirWatcher
from devplug._settings_groups import fields_of
from devplug._version import version
from devplug.errors import ConfigError, config_error_in
from devplug.logging import configure as configure_logging
from devplug.metrics import require_prometheus

if sys.version_info < (3, 11):  # anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

if TYPE_CHECKING:
    from collections.abc import Awaitable, Sequence
    from pathlib import Path

    from anyio.abc import TaskStatus
    from prometheus_client.registry import Collector

    from devplug._runtime.probes import ProbeServer
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

log = structlog.get_logger("devplug.runner")

Readiness = Callable[[], "str | None"]
"""A readiness condition: None when it holds, else why the process is not ready."""

Reload = Callable[[], "tuple[Settings, DevicePlugin | Iterable[DevicePlugin]]"]
"""Re-reads the configuration (on SIGHUP): the new settings and the new set of plugins; raises
ConfigError for an invalid configuration, which is then logged and not applied."""

HOST_FIXED_SETTINGS = (*fields_of("api"), *fields_of("metrics"))
"""Settings every process binds at start, whatever it serves."""

LOGGING_SETTINGS = fields_of("logging")


class Service(Protocol):
    """One Kubernetes API served by a :class:`Host`.

    The host calls :meth:`open` once before anything is served, then :meth:`serve` in its task
    group; readiness, state and collectors are read at any time from the event loop.
    """

    fixed_settings: tuple[str, ...]
    """Settings this service binds at start: a reload that changes one is refused."""

    def directories(self) -> Sequence[Path]:
        """The kubelet directories this service serves in (watched by the host)."""

    def directory_found(self, directory: Path) -> None:
        """Judge a watched directory when it is there; ConfigError refuses to go on."""

    def started_fields(self) -> dict[str, object]:
        """What the ``started`` log line says of this service."""

    async def open(self) -> None:
        """Everything that can fail for a configuration reason (ConfigError), before serving."""

    async def serve(self, host: Host, *, task_status: TaskStatus[None]) -> None:
        """Serve until cancelled; ``task_status.started()`` once serving has begun."""

    async def close(self) -> None:
        """Release what :meth:`open` took (called shielded, after serving)."""

    def readiness(self) -> list[str]:
        """Why this service is not ready; empty when it is."""

    def state(self) -> dict[str, Any]:
        """This service's part of ``/debug/state`` (merged into the document's top level)."""

    def collectors(self) -> Sequence[Collector]:
        """Its metrics, built only when metrics are on."""

    async def reload(
        self, old: Settings, new: Settings, plugins: Sequence[DevicePlugin]
    ) -> dict[str, list[str]]:
        """Apply a new configuration; what changed, by kind (added, restarted, ...).

        Raises:
            ConfigError: the new configuration cannot be applied without a restart.
        """


class Host:
    """Runs ``services`` in one process until cancelled or signalled.

    Args:
        services: what the process serves (one per Kubernetes API).
        settings: the process's settings.
        readiness: extra conditions of ``/readyz`` (a backend's "no GPU found"), each returning
            None when it holds or the reason it does not; :meth:`add_readiness` adds more.
        reload: what SIGHUP (or :meth:`reload`) calls for a new configuration.
    """

    def __init__(
        self,
        services: Sequence[Service],
        settings: Settings,
        *,
        readiness: Iterable[Readiness] = (),
        reload: Reload | None = None,
    ) -> None:
        self.services = tuple(services)
        self.settings = settings
        self.reloads: Counter[str] = Counter()
        """Reloads by result: applied, failed."""
        self.history: deque[dict[str, object]] = deque(maxlen=100)
        """Recent events of the process (resources added, restarted, removed; sockets; reloads)."""
        self.probes: ProbeServer | None = None
        """The metrics and probes server, while it runs (``metrics_address``)."""
        self._readiness = list(readiness)
        self._reload = reload
        self._started = anyio.Event()
        self._opened = False
        self._lock = anyio.Lock()
        self.watcher: DirWatcher | None = None
        """The watch on the kubelet's directories, while serving."""

    @property
    def fixed_settings(self) -> tuple[str, ...]:
        """Settings bound at start: a reload that changes one is refused."""
        fixed = [*HOST_FIXED_SETTINGS]
        for service in self.services:
            fixed.extend(f for f in service.fixed_settings if f not in fixed)
        return tuple(fixed)

    def add_readiness(self, check: Readiness) -> None:
        """Add a readiness condition (see the class arguments)."""
        self._readiness.append(check)

    async def wait_started(self) -> None:
        """Wait until the watch runs and every service has started serving."""
        await self._started.wait()

    def record(self, event: str, **fields: object) -> None:
        """Add an event to :attr:`history` (shown in ``/debug/state``)."""
        at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
        self.history.append({"at": at, "event": event, **fields})

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether the process is ready, and if not every reason why: every service started,
        the kubelet's directories there, every extra condition and every service ready."""
        reasons = [] if self._started.is_set() else ["starting"]
        if self.watcher is not None:
            reasons.extend(f"{p} does not exist (the kubelet creates it)" for p in self.watcher.missing)
        for check in self._readiness:
            try:
                why = check()
            except Exception as exc:
                why = f"readiness check failed: {exc}"
            if why:
                reasons.append(why)
        for service in self.services:
            reasons.extend(service.readiness())
        return not reasons, reasons

    def debug_state(self) -> dict[str, Any]:
        """What ``/debug/state`` and SIGUSR1 show: readiness, each service's state, the events."""
        ready, reasons = self.readiness()
        document: dict[str, Any] = {"ready": ready, "not_ready": reasons}
        for service in self.services:
            document.update(service.state())
        document["events"] = list(self.history)
        return document

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until cancelled, or until SIGTERM / SIGINT when ``handle_signals`` is true.

        With ``handle_signals``, SIGHUP reloads the configuration (:meth:`reload`) and SIGUSR1
        logs :meth:`debug_state`.

        Raises:
            ConfigError: a service refuses its configuration, prometheus-client is missing or
                the metrics port cannot be bound, a kubelet directory is refused.
        """
        if handle_signals:
            await until_signalled(self.serve, reload=self.reload, dump=self.debug_state)
        else:
            await self.serve()

    async def open(self) -> None:
        """Open every service and bind the metrics port: what can fail for a configuration
        reason fails here, before anything is served (:meth:`serve` calls it if needed)."""
        if self._opened:
            return
        for service in self.services:
            await service.open()
        address = self.settings.metrics_address
        if address:
            require_prometheus()
            from devplug._runtime.probes import ProbeServer

            collectors = [c for service in self.services for c in service.collectors()]
            probes = ProbeServer(self, address, collectors)
            await probes.bind()
            self.probes = probes
        self._opened = True

    async def serve(self) -> None:
        """Serve every service until cancelled (:meth:`open` first, if not done)."""
        try:
            await self.open()
            directories = list(dict.fromkeys(d for s in self.services for d in s.directories()))
            watcher = DirWatcher(*directories, on_found=self._judge)
            async with anyio.create_task_group() as tg:
                if self.probes is not None:
                    tg.start_soon(self.probes.serve)
                await tg.start(watcher.run)
                self.watcher = watcher
                fields: dict[str, object] = {}
                for service in self.services:
                    fields.update(service.started_fields())
                log.info("started", version=version(), **fields)
                for service in self.services:
                    await tg.start(service.serve, self)
                self._started.set()
                await anyio.sleep_forever()
        except BaseExceptionGroup as group:
            error = config_error_in(group)
            if error is None:
                raise
            raise error from None
        finally:
            with anyio.CancelScope(shield=True):
                if self.probes is not None:
                    await self.probes.aclose()
                for service in self.services:
                    await service.close()

    def _judge(self, directory: Path) -> None:
        for service in self.services:
            if directory in service.directories():
                service.directory_found(directory)

    async def reload(self) -> bool:
        """Apply a new configuration from the ``reload`` callback; whether it was applied.

        Each service applies what concerns it (the device-plugin service restarts the resources
        whose plugin object or settings changed; the DRA one restarts the feeds of replaced
        plugins). An invalid configuration, or one that changes a setting bound at start
        (:attr:`fixed_settings`), is logged and not applied.
        """
        if self._reload is None:
            log.warning("reload_unavailable", note="this process has no configuration to re-read")
            return False
        async with self._lock:
            try:
                settings, loaded = self._reload()
                plugins = as_list(loaded)
                fixed = [f for f in self.fixed_settings if getattr(settings, f) != getattr(self.settings, f)]
                if fixed:
                    raise ConfigError(f"{', '.join(fixed)} cannot change without a restart")
                old = self.settings
                changes: dict[str, list[str]] = {}
                for service in self.services:
                    for kind, names in (await service.reload(old, settings, plugins)).items():
                        changes.setdefault(kind, []).extend(names)
            except Exception as exc:
                self.reloads["failed"] += 1
                error = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                log.error("reload_failed", error=error, keeping="the current configuration")
                self.record("reload_failed", error=error)
                return False
            self.settings = settings
            if any(getattr(old, f) != getattr(settings, f) for f in LOGGING_SETTINGS):
                configure_logging(settings.log_format, settings.log_level)
            self.reloads["applied"] += 1
            log.info("reloaded", **changes)
            self.record("reloaded", **changes)
            return True


def settings_changed(old: Settings, new: Settings, *, ignore: Iterable[str] = ()) -> list[str]:
    """devplug's own settings that differ, except logging and ``ignore`` (a backend's own options,
    in a subclass, are its business: it says through new plugin objects what they change)."""
    from devplug.settings import Settings

    skipped = {*LOGGING_SETTINGS, *ignore, "config"}
    return [f for f in Settings.model_fields if f not in skipped and getattr(old, f) != getattr(new, f)]


def as_list(plugins: DevicePlugin | Iterable[DevicePlugin]) -> list[DevicePlugin]:
    """One plugin or several, as a list."""
    from devplug.plugin import DevicePlugin

    return [plugins] if isinstance(plugins, DevicePlugin) else list(plugins)


async def retry_forever(
    attempt: Callable[[], Awaitable[object]],
    failed: Callable[[Exception, float], None],
    *,
    errors: tuple[type[Exception], ...] = (Exception,),
    initial: float = 1.0,
    maximum: float = 30.0,
) -> None:
    """Run ``attempt`` again and again until cancelled: at once after it returns, after a capped,
    jittered back-off after it raises one of ``errors`` (``failed(error, delay)`` is told first).

    What one service or resource does wrong must not take the process down: the rest keeps
    serving while this one retries. A ConfigError is the exception: it says that no retry can
    work (a directory this process may not write to), and is raised for the process to stop
    with its one line.
    """
    backoff = Backoff(initial=initial, maximum=maximum)
    while True:
        try:
            await attempt()
        except errors as exc:
            refusal = config_error_in(exc)
            if refusal is not None:
                raise refusal from None
            delay = backoff.next()
            failed(exc, delay)
            await anyio.sleep(delay)
        else:
            backoff.reset()
