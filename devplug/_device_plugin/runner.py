"""The process: one watcher per kubelet directory, one runner per resource, signals, shutdown."""

from __future__ import annotations

import datetime
import os
import sys
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import anyio
import structlog

from devplug._device_plugin.introspect import not_ready_reason, resource_state
from devplug._device_plugin.resource import ResourceRunner, ResourceStatus, RestartReason
from devplug._device_plugin.telemetry import ResourceCounters
from devplug._names import resource_name_problem
from devplug._runtime.backoff import Backoff
from devplug._runtime.signals import until_signalled
from devplug._runtime.sockets import MAX_SOCKET_PATH, directory_exposure, unique_socket_name
from devplug._runtime.watch import DirWatcher
from devplug._version import version
from devplug.errors import ConfigError, config_error_in
from devplug.logging import configure as configure_logging
from devplug.metrics import require_prometheus
from devplug.plugin import DevicePlugin
from devplug.settings import Settings

if sys.version_info < (3, 11):  # anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus

    from devplug._runtime.probes import ProbeServer
    from devplug.models import Device

log = structlog.get_logger("devplug.runner")
S = TypeVar("S", bound=Settings)


@runtime_checkable
class PluginSource(Protocol):
    """Finds resources at run time (a vendor with several device types, NVIDIA's mixed MIG).

    ``watch_plugins`` yields the complete set of plugins whenever it changes: resources that
    appear get a server, those that vanish are stopped, and a resource whose plugin object is
    replaced is restarted with the new one.
    """

    def watch_plugins(self) -> AsyncIterator[Sequence[DevicePlugin]]: ...


Plugins = DevicePlugin | Iterable[DevicePlugin] | PluginSource

Readiness = Callable[[], "str | None"]
"""A readiness condition: None when it holds, else why the process is not ready."""

Reload = Callable[[], "tuple[Settings, DevicePlugin | Iterable[DevicePlugin]]"]
"""Re-reads the configuration (on SIGHUP): the new settings and the new set of plugins; raises
ConfigError for an invalid configuration, which is then logged and not applied."""

# Bound when the process starts (directories watched, the registration mode, the metrics
# port): a reload that changes them is refused, and the process needs a restart.
FIXED_SETTINGS = (
    "device_plugin_dir",
    "kubelet_socket",
    "registration",
    "plugins_registry_dir",
    "metrics_address",
    "insecure_dir",
)
_LOGGING = ("log_format", "log_level")
# What every resource runs with: a change restarts them all.
_RESOURCE_SETTINGS = tuple(
    name for name in Settings.model_fields if name not in (*FIXED_SETTINGS, *_LOGGING, "config")
)


@dataclass
class _Running:
    plugin: DevicePlugin
    runner: ResourceRunner
    scope: anyio.CancelScope
    done: anyio.Event


class Runner:
    """Serves a set of plugins until cancelled or signalled; see :func:`devplug.serve`.

    Args:
        plugins: one plugin, several, or a :class:`PluginSource`.
        settings: the runner options (default: :class:`Settings` defaults).
        readiness: extra conditions of ``/readyz`` (a backend's "no GPU found"), each returning
            None when it holds or the reason it does not; :meth:`add_readiness` adds more.
        reload: what SIGHUP (or :meth:`reload`) calls for a new configuration; resources whose
            plugin object or settings changed are restarted, the others keep serving. Not with
            a :class:`PluginSource`, which changes the set by itself.

    Raises:
        ValueError: ``reload`` together with a :class:`PluginSource`.
    """

    def __init__(
        self,
        plugins: Plugins,
        settings: Settings | None = None,
        *,
        readiness: Iterable[Readiness] = (),
        reload: Reload | None = None,
    ) -> None:
        if reload is not None and isinstance(plugins, PluginSource):
            raise ValueError("reload cannot be combined with a PluginSource")
        self.plugins = plugins
        self.settings = settings or Settings()
        self.counters: dict[str, ResourceCounters] = {}
        """What each resource name has counted since the process started (metrics)."""
        self.reloads: Counter[str] = Counter()
        """Reloads by result: applied, failed."""
        self.history: deque[dict[str, object]] = deque(maxlen=100)
        """The runner's recent events (resources added, restarted, removed; reloads)."""
        self.probes: ProbeServer | None = None
        """The metrics and probes server, while it runs (``metrics_address``)."""
        self._readiness = list(readiness)
        self._reload = reload
        self._running: dict[str, _Running] = {}
        self._started = anyio.Event()
        self._lock = anyio.Lock()
        self._tg: TaskGroup | None = None
        self._watcher: DirWatcher | None = None

    @property
    def resources(self) -> dict[str, ResourceStatus]:
        """The status of every resource served now, by resource name."""
        return {name: r.runner.status for name, r in self._running.items()}

    def devices(self, resource: str) -> tuple[Device, ...]:
        """The devices ``resource`` lists now (empty for a resource not served)."""
        running = self._running.get(resource)
        return running.runner.state.current.devices if running is not None else ()

    def add_readiness(self, check: Readiness) -> None:
        """Add a readiness condition (see the class arguments)."""
        self._readiness.append(check)

    async def wait_started(self) -> None:
        """Wait until the watchers run and the first set of plugins has been started."""
        await self._started.wait()

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether the process is ready, and if not every reason why.

        Ready: the first set of plugins is started, the kubelet's directories exist, every
        extra condition holds, and every resource is registered (in plugin-watcher mode: the
        kubelet said so) with a device list sent on a ListAndWatch stream that is still open
        since its last (re)registration.
        """
        reasons = [] if self._started.is_set() else ["starting"]
        if self._watcher is not None:
            reasons.extend(f"{p} does not exist (the kubelet creates it)" for p in self._watcher.missing)
        for check in self._readiness:
            try:
                why = check()
            except Exception as exc:
                why = f"readiness check failed: {exc}"
            if why:
                reasons.append(why)
        for name, running in sorted(self._running.items()):
            why = not_ready_reason(running.runner)
            if why:
                reasons.append(f"{name}: {why}")
        return not reasons, reasons

    def debug_state(self) -> dict[str, Any]:
        """What each resource last sent to the kubelet, its registration history, readiness."""
        ready, reasons = self.readiness()
        return {
            "ready": ready,
            "not_ready": reasons,
            "registration": self.settings.registration,
            "resources": {
                name: resource_state(running.runner) for name, running in sorted(self._running.items())
            },
            "events": list(self.history),
        }

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until cancelled, or until SIGTERM / SIGINT when ``handle_signals`` is true.

        With ``handle_signals``, SIGHUP reloads the configuration (:meth:`reload`) and SIGUSR1
        logs :meth:`debug_state`.

        Raises:
            ConfigError: ``metrics_address`` is set but prometheus-client is missing, or its
                port cannot be bound; a kubelet directory is writable by every user (at start,
                or when a directory missing then appears) and ``insecure_dir`` is refuse.
        """
        if handle_signals:
            await until_signalled(self._serve, reload=self.reload, dump=self.debug_state)
        else:
            await self._serve()

    async def _serve(self) -> None:
        settings = self.settings
        if not isinstance(self.plugins, PluginSource):
            check_plugins(_as_list(self.plugins), settings)
        _check_directories(settings)
        if settings.metrics_address:
            require_prometheus()
            from devplug._device_plugin.metrics import DevicePluginCollector
            from devplug._runtime.probes import ProbeServer

            self.probes = ProbeServer(self, settings.metrics_address, [DevicePluginCollector(self)])
            await self.probes.bind()
        # One inotify watch set for the process: the sockets' directory, and in kubelet mode
        # the kubelet socket's own directory when it is configured elsewhere. A directory that
        # is missing is the kubelet's to create: it is judged when it appears.
        directories = _kubelet_directories(settings)
        directory = directories[0]
        watcher = DirWatcher(*directories, on_found=partial(_judge_directory, settings))
        try:
            async with anyio.create_task_group() as tg:
                self._tg, self._watcher = tg, watcher
                if self.probes is not None:
                    tg.start_soon(self.probes.serve)
                await tg.start(watcher.run)
                log.info(
                    "started", version=version(), registration=settings.registration, directory=str(directory)
                )
                try:
                    if isinstance(self.plugins, PluginSource):
                        async for plugins in self.plugins.watch_plugins():
                            async with self._lock:
                                await self._apply(plugins)
                        log.warning("plugin_source_ended", keeping=sorted(self._running))
                    else:
                        async with self._lock:
                            await self._apply(_as_list(self.plugins))
                    await anyio.sleep_forever()
                finally:
                    log.info("stopping", resources=sorted(self._running))
        except BaseExceptionGroup as group:
            error = config_error_in(group)
            if error is None:
                raise
            raise error from None
        finally:
            if self.probes is not None:
                with anyio.CancelScope(shield=True):
                    await self.probes.aclose()

    async def reload(self) -> bool:
        """Apply a new configuration from the ``reload`` callback; whether it was applied.

        Resources whose plugin object changed, or all of them when the settings they run with
        changed, are restarted; the others keep serving. An invalid configuration, or one that
        changes a setting bound at start (:data:`FIXED_SETTINGS`), is logged and not applied.
        """
        if self._reload is None:
            log.warning("reload_unavailable", note="this runner has no configuration to re-read")
            return False
        async with self._lock:
            try:
                settings, plugins = self._reload()
                fixed = [f for f in FIXED_SETTINGS if getattr(settings, f) != getattr(self.settings, f)]
                if fixed:
                    raise ConfigError(f"{', '.join(fixed)} cannot change without a restart")
            except Exception as exc:
                self.reloads["failed"] += 1
                error = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                log.error("reload_failed", error=error, keeping="the current configuration")
                self._record("reload_failed", error=error)
                return False
            old, self.settings = self.settings, settings
            if any(getattr(old, f) != getattr(settings, f) for f in _LOGGING):
                configure_logging(settings.log_format, settings.log_level)
            changed = [f for f in _RESOURCE_SETTINGS if getattr(old, f) != getattr(settings, f)]
            changes = await self._apply(_as_list(plugins), restart_all=bool(changed))
            self.reloads["applied"] += 1
            log.info("reloaded", settings_changed=changed, **changes)
            self._record("reloaded", settings_changed=changed, **changes)
            return True

    def _record(self, event: str, **fields: object) -> None:
        at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
        self.history.append({"at": at, "event": event, **fields})

    async def _apply(
        self, plugins: Sequence[DevicePlugin], *, restart_all: bool = False
    ) -> dict[str, list[str]]:
        """Make ``plugins`` the served set; returns the names added, restarted, removed, kept."""
        tg, watcher = self._tg, self._watcher
        assert tg is not None, "run() first"
        assert watcher is not None, "run() first"
        wanted: dict[str, DevicePlugin] = {}
        for plugin in plugins:
            name = getattr(plugin, "resource_name", None)
            if not isinstance(name, str) or not name:
                log.error("plugin_without_resource_name", plugin=type(plugin).__name__)
                continue
            problem = resource_name_problem(name)
            if problem is not None:  # a plugin source's: the others keep serving
                log.error("invalid_resource_name", plugin=type(plugin).__name__, problem=problem)
                continue
            if name in wanted:
                log.error("duplicate_resource", resource=name)
                continue
            wanted[name] = plugin
        changes: dict[str, list[str]] = {"added": [], "restarted": [], "removed": [], "unchanged": []}
        stopping = []
        for name, running in list(self._running.items()):
            change = _change_of(running.plugin, wanted.get(name), restart_all=restart_all)
            changes[change].append(name)
            if change == "unchanged":
                continue
            log.info(f"resource_{change}", resource=name)
            running.scope.cancel()
            stopping.append(running.done)
            del self._running[name]
        # The old server is gone before its successor registers: a kubelet that sees two
        # endpoints of one resource may drop the new one when the old one's stream ends.
        for done in stopping:
            await done.wait()
        for name, plugin in wanted.items():
            if name in self._running:
                continue
            counters = self.counters.setdefault(name, ResourceCounters(name))
            reason: RestartReason = "replaced" if name in changes["restarted"] else "start"
            runner = ResourceRunner(plugin, self.settings, watcher, counters=counters, first_reason=reason)
            done = anyio.Event()
            scope = await tg.start(self._run_resource, runner, done)
            self._running[name] = _Running(plugin, runner, scope, done)
            if reason == "start":
                changes["added"].append(name)
        for event in ("added", "restarted", "removed"):
            for name in changes[event]:
                self._record(f"resource_{event}", resource=name)
        self._started.set()
        return changes

    async def _run_resource(
        self, runner: ResourceRunner, done: anyio.Event, *, task_status: TaskStatus[anyio.CancelScope]
    ) -> None:
        backoff = Backoff(initial=1.0, maximum=30.0)
        try:
            with anyio.CancelScope() as scope:
                task_status.started(scope)
                while True:
                    try:
                        await runner.run()
                    except Exception:
                        # A bug in one resource (or its plugin) must not take the others down.
                        delay = backoff.next()
                        log.exception("resource_failed", resource=runner.plugin.resource_name, retry_in=delay)
                        await anyio.sleep(delay)
        finally:
            done.set()


def _kubelet_directories(settings: Settings) -> list[Path]:
    """The kubelet's directories this process watches; the first one holds its sockets."""
    if settings.registration == "watcher":
        return [settings.plugins_registry_dir]
    return list(dict.fromkeys([settings.device_plugin_dir, settings.kubelet_socket_path.parent]))


def _check_directories(settings: Settings) -> None:
    """Judge the kubelet directories this process watches; none is created (the kubelet does).

    A path that is there must be a directory. Anyone who can write to the device-plugin
    directory can put their own ``kubelet.sock`` there, or replace this plugin's socket and be
    dialled by the kubelet in its place (and then answer Allocate with any mount or device
    node): the directories above a missing one are judged now, the directory itself when it
    appears.
    """
    for directory in _kubelet_directories(settings):
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"{directory} exists and is not a directory")
        _judge_directory(settings, directory)


def _judge_directory(settings: Settings, directory: Path) -> None:
    """Refuse (ConfigError) or warn about a kubelet directory that every user may write to."""
    problem = directory_exposure(directory)
    if problem is None:
        return
    if settings.insecure_dir == "refuse":
        raise ConfigError(
            f"refusing to start: {problem}; anyone could replace the kubelet's or this plugin's "
            "socket; remove that write permission (chmod o-w) or pass --insecure-dir=warn"
        )
    log.warning("insecure_directory", problem=problem, note="anyone could replace the sockets in it")


def check_plugins(plugins: Sequence[DevicePlugin], settings: Settings) -> None:
    """Refuse, before anything is served, what the kubelet would refuse for ever.

    A resource name that is not an extended resource name (the kubelet answers every Register
    with an error, and the plugin would retry for ever), or a socket path longer than a unix
    socket's 107 bytes.

    Raises:
        ConfigError: naming the plugin class and the problem.
    """
    if settings.registration == "watcher":
        directory = settings.plugins_registry_dir
    else:
        directory = settings.device_plugin_dir
    for plugin in plugins:
        name = getattr(plugin, "resource_name", None)
        problem = resource_name_problem(name)
        if problem is not None:
            raise ConfigError(f"plugin {type(plugin).__name__}: {problem}")
        assert isinstance(name, str)
        longest = Path(os.path.abspath(directory)) / unique_socket_name(name)
        if len(os.fsencode(longest)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"the socket path {longest} is {len(os.fsencode(longest))} bytes, over the "
                f"{MAX_SOCKET_PATH}-byte limit of a unix socket: use a shorter directory or resource name"
            )


def _change_of(running: DevicePlugin, wanted: DevicePlugin | None, *, restart_all: bool) -> str:
    if wanted is None:
        return "removed"
    return "restarted" if restart_all or wanted is not running else "unchanged"


def _as_list(plugins: DevicePlugin | Iterable[DevicePlugin]) -> list[DevicePlugin]:
    return [plugins] if isinstance(plugins, DevicePlugin) else list(plugins)


async def serve(
    plugins: Plugins,
    settings: Settings | None = None,
    *,
    handle_signals: bool = True,
    readiness: Iterable[Readiness] = (),
    reload: Reload | None = None,
) -> None:
    """Serve ``plugins`` to the kubelet until cancelled (or SIGTERM / SIGINT).

    ``plugins`` is one :class:`DevicePlugin`, several, or a :class:`PluginSource` that adds and
    removes resources at run time. Needs the asyncio backend (grpc.aio runs on asyncio).
    ``readiness`` and ``reload`` are :class:`Runner`'s.
    """
    await Runner(plugins, settings, readiness=readiness, reload=reload).run(handle_signals=handle_signals)
