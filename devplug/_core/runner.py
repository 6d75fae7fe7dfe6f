"""The process: one watcher per kubelet directory, one runner per resource, signals, shutdown."""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import anyio
import structlog

from devplug._core.backoff import Backoff
from devplug._core.resource import ResourceRunner, ResourceStatus
from devplug._core.watch import DirWatcher
from devplug.errors import ConfigError
from devplug.logging import configure as configure_logging
from devplug.plugin import DevicePlugin
from devplug.settings import Settings, load_settings

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus

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


class Runner:
    """Serves a set of plugins until cancelled or signalled; see :func:`devplug.serve`."""

    def __init__(self, plugins: Plugins, settings: Settings | None = None) -> None:
        self.plugins = plugins
        self.settings = settings or Settings()
        self._running: dict[str, tuple[DevicePlugin, ResourceRunner, anyio.CancelScope]] = {}
        self._started = anyio.Event()

    @property
    def resources(self) -> dict[str, ResourceStatus]:
        """The status of every resource served now, by resource name."""
        return {name: runner.status for name, (_, runner, _) in self._running.items()}

    async def wait_started(self) -> None:
        """Wait until the watchers run and the first set of plugins has been started."""
        await self._started.wait()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until cancelled, or until SIGTERM / SIGINT when ``handle_signals`` is true."""
        settings = self.settings
        # One inotify watch set for the process: the sockets' directory, and in kubelet mode
        # the kubelet socket's own directory when it is configured elsewhere.
        if settings.registration == "watcher":
            directory = settings.plugins_registry_dir
            watcher = DirWatcher(directory)
        else:
            directory = settings.device_plugin_dir
            watcher = DirWatcher(directory, settings.kubelet_socket_path.parent)
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._stop_on_signal, tg)
            await tg.start(watcher.run)
            log.info("started", registration=settings.registration, directory=str(directory))
            try:
                if isinstance(self.plugins, PluginSource):
                    async for plugins in self.plugins.watch_plugins():
                        await self._apply(tg, watcher, plugins)
                    log.warning("plugin_source_ended", keeping=sorted(self._running))
                else:
                    plugins = [self.plugins] if isinstance(self.plugins, DevicePlugin) else list(self.plugins)
                    await self._apply(tg, watcher, plugins)
                await anyio.sleep_forever()
            finally:
                log.info("stopping", resources=sorted(self._running))

    async def _apply(self, tg: TaskGroup, watcher: DirWatcher, plugins: Sequence[DevicePlugin]) -> None:
        wanted: dict[str, DevicePlugin] = {}
        for plugin in plugins:
            name = getattr(plugin, "resource_name", None)
            if not isinstance(name, str) or not name:
                log.error("plugin_without_resource_name", plugin=type(plugin).__name__)
                continue
            if name in wanted:
                log.error("duplicate_resource", resource=name)
                continue
            wanted[name] = plugin
        for name, (plugin, _, scope) in list(self._running.items()):
            if wanted.get(name) is not plugin:
                log.info("resource_removed" if name not in wanted else "resource_replaced", resource=name)
                scope.cancel()
                del self._running[name]
        for name, plugin in wanted.items():
            if name not in self._running:
                runner = ResourceRunner(plugin, self.settings, watcher)
                scope = await tg.start(self._run_resource, runner)
                self._running[name] = (plugin, runner, scope)
        self._started.set()

    async def _run_resource(
        self, runner: ResourceRunner, *, task_status: TaskStatus[anyio.CancelScope]
    ) -> None:
        backoff = Backoff(initial=1.0, maximum=30.0)
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

    async def _stop_on_signal(self, tg: TaskGroup) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("signal_received", signal=signal.Signals(signum).name)
                tg.cancel_scope.cancel()
                return


async def serve(plugins: Plugins, settings: Settings | None = None, *, handle_signals: bool = True) -> None:
    """Serve ``plugins`` to the kubelet until cancelled (or SIGTERM / SIGINT).

    ``plugins`` is one :class:`DevicePlugin`, several, or a :class:`PluginSource` that adds and
    removes resources at run time. Needs the asyncio backend (grpc.aio runs on asyncio).
    """
    await Runner(plugins, settings).run(handle_signals=handle_signals)


def run(
    plugins: Plugins | Callable[[S], Plugins],
    settings: S | None = None,
    *,
    settings_cls: type[S] = Settings,  # type: ignore[assignment]
    argv: list[str] | None = None,
    prog: str | None = None,
) -> int:
    """Blocking entry point for a plugin's ``main``: serve until SIGTERM / SIGINT, return 0.

    Without ``settings``, the standard runner options are read from ``argv`` (default
    ``sys.argv[1:]``), ``DEVPLUG_*`` and ``--config`` into ``settings_cls``, and logging is
    configured from them; an invalid option prints one line and raises ``SystemExit(2)``.
    ``plugins`` may be a factory taking the settings (a subclass of :class:`Settings` carries a
    backend's own options).
    """
    if settings is None:
        try:
            settings = load_settings(settings_cls, argv, prog=prog)
        except ConfigError as exc:
            print(f"{prog or 'devplug'}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        configure_logging(settings.log_format, settings.log_level)
    resolved = plugins(settings) if callable(plugins) and not isinstance(plugins, DevicePlugin) else plugins
    anyio.run(serve, resolved, settings, backend="asyncio")
    return 0
