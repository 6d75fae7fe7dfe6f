"""The device-plugin service: one :class:`ResourceRunner` per resource, added, restarted and
removed as the plugin set changes, hosted by :class:`devplug._runtime.host.Host`.

:class:`Runner` is the public face (``devplug.Runner``): a host with this one service.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio
import structlog

from devplug._device_plugin.introspect import not_ready_reason, resource_state
from devplug._device_plugin.resource import ResourceRunner, ResourceStatus, RestartReason
from devplug._device_plugin.telemetry import ResourceCounters
from devplug._hooks import hook_problem
from devplug._names import resource_name_problem
from devplug._runtime.host import Host, Readiness, Reload, as_list, retry_forever, settings_changed
from devplug._runtime.sockets import MAX_SOCKET_PATH, directory_exposure, unique_socket_name, unwritable
from devplug._settings_groups import fields_of
from devplug.errors import ConfigError
from devplug.plugin import DevicePlugin
from devplug.settings import Settings

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus
    from prometheus_client.registry import Collector

    from devplug._runtime.ledger import Ledger
    from devplug.models import Device

log = structlog.get_logger("devplug.runner")

__all__ = [
    "FIXED_SETTINGS",
    "DevicePluginService",
    "PluginSource",
    "Plugins",
    "Readiness",
    "Reload",
    "Runner",
]


@runtime_checkable
class PluginSource(Protocol):
    """Finds resources at run time (a vendor with several device types, NVIDIA's mixed MIG).

    ``watch_plugins`` yields the complete set of plugins whenever it changes: resources that
    appear get a server, those that vanish are stopped, and a resource whose plugin object is
    replaced is restarted with the new one.
    """

    def watch_plugins(self) -> AsyncIterator[Sequence[DevicePlugin]]: ...


Plugins = DevicePlugin | Iterable[DevicePlugin] | PluginSource

# Bound when the process starts (the kubelet's directories watched, the registration mode): a
# reload that changes them is refused, and the process needs a restart.
FIXED_SETTINGS: tuple[str, ...] = (*fields_of("kubelet"), "registration")


@dataclass
class _Running:
    plugin: DevicePlugin
    runner: ResourceRunner
    scope: anyio.CancelScope
    done: anyio.Event


class DevicePluginService:
    """Serves plugins through the device-plugin API, one resource each, on a :class:`Host`."""

    fixed_settings = FIXED_SETTINGS

    def __init__(self, plugins: Plugins, settings: Settings, *, ledger: Ledger | None = None) -> None:
        self.plugins = plugins
        self.settings = settings
        self.ledger = ledger
        """Both APIs served: the holders of both (devices DRA holds are reported Unhealthy)."""
        self.counters: dict[str, ResourceCounters] = {}
        """What each resource name has counted since the process started (metrics)."""
        self._running: dict[str, _Running] = {}
        self._lock = anyio.Lock()
        self._tg: TaskGroup | None = None
        self._host: Host | None = None

    @property
    def resources(self) -> dict[str, ResourceStatus]:
        """The status of every resource served now, by resource name."""
        return {name: r.runner.status for name, r in self._running.items()}

    def devices(self, resource: str) -> tuple[Device, ...]:
        """The devices ``resource`` lists now (empty for a resource not served)."""
        running = self._running.get(resource)
        return running.runner.state.current.devices if running is not None else ()

    # -- the Service interface ------------------------------------------------------------------

    def directories(self) -> list[Path]:
        return _kubelet_directories(self.settings)

    def directory_found(self, directory: Path) -> None:
        _judge_directory(self.settings, directory)

    def started_fields(self) -> dict[str, object]:
        return {"registration": self.settings.registration, "directory": str(self.directories()[0])}

    async def open(self) -> None:
        if not isinstance(self.plugins, PluginSource):
            check_plugins(as_list(self.plugins), self.settings)
        _check_directories(self.settings)

    async def close(self) -> None:
        pass

    def readiness(self) -> list[str]:
        reasons = []
        for name, running in sorted(self._running.items()):
            why = not_ready_reason(running.runner)
            if why:
                reasons.append(f"{name}: {why}")
        return reasons

    def state(self) -> dict[str, Any]:
        return {
            "registration": self.settings.registration,
            "resources": {
                name: resource_state(running.runner) for name, running in sorted(self._running.items())
            },
        }

    def collectors(self) -> list[Collector]:
        from devplug._device_plugin.metrics import DevicePluginCollector

        return [DevicePluginCollector(self)]

    async def serve(self, host: Host, *, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            self._tg, self._host = tg, host
            try:
                if isinstance(self.plugins, PluginSource):
                    first = True
                    async for plugins in self.plugins.watch_plugins():
                        async with self._lock:
                            await self._apply(plugins)
                        if first:
                            task_status.started()
                            first = False
                    log.warning("plugin_source_ended", keeping=sorted(self._running))
                    if first:
                        task_status.started()
                else:
                    async with self._lock:
                        await self._apply(as_list(self.plugins))
                    task_status.started()
                await anyio.sleep_forever()
            finally:
                log.info("stopping", resources=sorted(self._running))

    async def reload(
        self, old: Settings, new: Settings, plugins: Sequence[DevicePlugin]
    ) -> dict[str, list[str]]:
        if isinstance(self.plugins, PluginSource):
            return {}  # the source changes the set by itself
        changed = settings_changed(old, new, ignore=self.fixed_settings)
        check_plugins(plugins, new)
        async with self._lock:
            self.settings = new
            changes = await self._apply(plugins, restart_all=bool(changed))
        return {"settings_changed": changed, **changes}

    # -- resources ------------------------------------------------------------------------------

    async def _apply(
        self, plugins: Sequence[DevicePlugin], *, restart_all: bool = False
    ) -> dict[str, list[str]]:
        """Make ``plugins`` the served set; returns the names added, restarted, removed, kept."""
        tg, host = self._tg, self._host
        assert tg is not None, "serve() first"
        assert host is not None, "serve() first"
        watcher = host.watcher
        assert watcher is not None, "serve() first"
        wanted = _servable(plugins)
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
            runner = ResourceRunner(
                plugin, self.settings, watcher, counters=counters, first_reason=reason, ledger=self.ledger
            )
            done = anyio.Event()
            scope = await tg.start(self._run_resource, runner, done)
            self._running[name] = _Running(plugin, runner, scope, done)
            if reason == "start":
                changes["added"].append(name)
        for event in ("added", "restarted", "removed"):
            for name in changes[event]:
                host.record(f"resource_{event}", resource=name)
        return changes

    async def _run_resource(
        self, runner: ResourceRunner, done: anyio.Event, *, task_status: TaskStatus[anyio.CancelScope]
    ) -> None:
        def failed(exc: Exception, delay: float) -> None:
            # A bug in one resource (or its plugin) must not take the others down.
            log.error("resource_failed", resource=runner.plugin.resource_name, retry_in=delay, exc_info=exc)

        try:
            with anyio.CancelScope() as scope:
                task_status.started(scope)
                await retry_forever(runner.run, failed)
        finally:
            done.set()


class Runner(Host):
    """Serves a set of plugins through the device-plugin API until cancelled or signalled; see
    :func:`devplug.serve`.

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
        settings = settings or Settings()
        self.service = DevicePluginService(plugins, settings)
        super().__init__([self.service], settings, readiness=readiness, reload=reload)

    @property
    def plugins(self) -> Plugins:
        """What is served: the plugins, or the source that finds them."""
        return self.service.plugins

    @property
    def counters(self) -> dict[str, ResourceCounters]:
        """What each resource name has counted since the process started (metrics)."""
        return self.service.counters

    @property
    def resources(self) -> dict[str, ResourceStatus]:
        """The status of every resource served now, by resource name."""
        return self.service.resources

    def devices(self, resource: str) -> tuple[Device, ...]:
        """The devices ``resource`` lists now (empty for a resource not served)."""
        return self.service.devices(resource)


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
    """Refuse (ConfigError) or warn about a kubelet directory that every user may write to;
    refuse the sockets' directory when this process may not create files in it."""
    if directory == _kubelet_directories(settings)[0]:
        refusal = unwritable(directory)
        if refusal is not None:
            raise ConfigError(refusal)
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
    with an error, and the plugin would retry for ever), a socket path longer than a unix
    socket's 107 bytes, or a hook that cannot work as written (:func:`devplug._hooks.hook_problem`).

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
        if problem is None:
            problem = hook_problem(type(plugin), "device-plugin")
        if problem is not None:
            raise ConfigError(f"plugin {type(plugin).__name__}: {problem}")
        assert isinstance(name, str)
        longest = Path(os.path.abspath(directory)) / unique_socket_name(name)
        if len(os.fsencode(longest)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"the socket path {longest} is {len(os.fsencode(longest))} bytes, over the "
                f"{MAX_SOCKET_PATH}-byte limit of a unix socket: use a shorter directory or resource name"
            )


def _servable(plugins: Sequence[DevicePlugin]) -> dict[str, DevicePlugin]:
    """The plugins that can be served, by resource name; each one left out is logged (a plugin
    source's: the others keep serving)."""
    wanted: dict[str, DevicePlugin] = {}
    for plugin in plugins:
        name = getattr(plugin, "resource_name", None)
        if not isinstance(name, str) or not name:
            log.error("plugin_without_resource_name", plugin=type(plugin).__name__)
            continue
        problem = resource_name_problem(name)
        if problem is not None:
            log.error("invalid_resource_name", plugin=type(plugin).__name__, problem=problem)
            continue
        if name in wanted:
            log.error("duplicate_resource", resource=name)
            continue
        problem = hook_problem(type(plugin), "device-plugin")
        if problem is not None:
            log.error("unusable_hook", plugin=type(plugin).__name__, problem=problem)
            continue
        wanted[name] = plugin
    return wanted


def _change_of(running: DevicePlugin, wanted: DevicePlugin | None, *, restart_all: bool) -> str:
    if wanted is None:
        return "removed"
    return "restarted" if restart_all or wanted is not running else "unchanged"
