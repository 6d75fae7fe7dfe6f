"""The blocking entry point every command shares: options, logging, then the chosen API's runtime.

``api=device-plugin`` serves through :class:`devplug._device_plugin.runner.Runner`; ``api=dra`` through
:class:`devplug._dra.driver.DraDriver`, imported only then (its API client is not needed, nor
loaded, by a device plugin).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from devplug._device_plugin.runner import Plugins, PluginSource, Reload, _as_list, serve
from devplug._extras import require_dra
from devplug._names import is_dns_subdomain
from devplug._runtime.signals import install_signals, run_async, until_signalled
from devplug.errors import ConfigError
from devplug.logging import configure as configure_logging
from devplug.plugin import DevicePlugin
from devplug.settings import Settings, load_settings

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

S = TypeVar("S", bound=Settings)


def run(
    plugins: Plugins | Callable[[S], Plugins],
    settings: S | None = None,
    *,
    settings_cls: type[S] = Settings,  # type: ignore[assignment]
    argv: list[str] | None = None,
    prog: str | None = None,
    api: str | None = None,
    driver_name: str | None = None,
) -> int:
    """Blocking entry point for a plugin's ``main``: serve until SIGTERM / SIGINT, return 0.

    Without ``settings``, the standard runner options are read from ``argv`` (default
    ``sys.argv[1:]``), ``DEVPLUG_*`` and ``--config`` into ``settings_cls``, and logging is
    configured from them; an invalid option prints one line and raises ``SystemExit(2)``.
    With ``api=device-plugin`` (the default), SIGHUP then reads them again: when they changed,
    ``plugins`` (a factory) is called with the new settings, and the resources whose plugin
    object is new are restarted (a factory that returns the same object for an unchanged
    resource keeps it serving). With ``api=dra`` the plugins are served as one DRA driver
    (:mod:`devplug.dra`). ``plugins`` may be a factory taking the settings (a subclass of
    :class:`Settings` carries a backend's own options). ``api``, when given, overrides the
    options' (:func:`devplug.dra.run` sets it); ``driver_name`` is the default of theirs.
    """
    name = prog or "devplug"
    install_signals(name)  # from here on a SIGTERM / Ctrl-C never ends in a traceback
    reload: Reload | None = None
    try:
        if settings is None:
            settings = load_settings(settings_cls, argv, prog=prog)
            configure_logging(settings.log_format, settings.log_level)
            reload = _reloader(plugins, settings, settings_cls, argv, prog)
        settings = _with_defaults(settings, api=api, driver_name=driver_name)
        resolved = _resolve(plugins, settings)
        if settings.api == "dra":
            main = _dra_main(resolved, settings)
        else:
            if isinstance(resolved, PluginSource):
                reload = None
            main = partial(serve, resolved, settings, reload=reload)
        run_async(main)
    except KeyboardInterrupt:
        # Ctrl-C before the signal handlers were in place (reading options, connecting, or
        # an import): nothing was served yet, so nothing is left to remove.
        print(f"{name}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return 0


def _with_defaults(settings: S, *, api: str | None, driver_name: str | None) -> S:
    update: dict[str, Any] = {}
    if api is not None:
        update["api"] = api
    if driver_name is not None and settings.driver_name is None:
        if not is_dns_subdomain(driver_name, 63):
            raise ConfigError(f"invalid setting driver_name: {driver_name!r} is not a DNS subdomain")
        update["driver_name"] = driver_name
    return settings.model_copy(update=update) if update else settings


def _dra_main(plugins: Plugins, settings: Settings) -> Callable[[], Awaitable[None]]:
    from devplug._dra.driver import DraDriver

    require_dra()

    if isinstance(plugins, PluginSource):
        raise ConfigError("a PluginSource cannot be served as a DRA driver; pass the plugins themselves")
    driver = DraDriver(_as_list(plugins), settings)

    async def main() -> None:
        await driver.open()  # a configuration error is one line, before anything is served
        await serve_with_signals(driver.serve, driver)

    return main


class _Dumps(Protocol):
    def debug_state(self) -> dict[str, Any]: ...


async def serve_with_signals(
    main: Callable[[], Awaitable[None]], target: _Dumps, *, handle: bool = True
) -> None:
    """Run ``main`` until it returns or SIGTERM / SIGINT (SIGUSR1 logs ``target.debug_state()``)."""
    if handle:
        await until_signalled(main, dump=target.debug_state)
    else:
        await main()


def _resolve(plugins: Plugins | Callable[[S], Plugins], settings: S) -> Plugins:
    return plugins(settings) if callable(plugins) and not isinstance(plugins, DevicePlugin) else plugins


def _reloader(
    plugins: Plugins | Callable[[S], Plugins],
    settings: S,
    settings_cls: type[S],
    argv: list[str] | None,
    prog: str | None,
) -> Reload:
    """Re-read the options the way :func:`run` read them at start."""
    last: list[Any] = [settings, None]

    def reload() -> tuple[Settings, DevicePlugin | Iterable[DevicePlugin]]:
        new = load_settings(settings_cls, argv, prog=prog)
        if new == last[0] and last[1] is not None:
            return new, last[1]  # nothing changed: the same objects, nothing restarts
        resolved = _resolve(plugins, new)
        if isinstance(resolved, PluginSource):
            raise ConfigError("the reloaded configuration yields a plugin source; restart the process")
        last[:] = [new, _as_list(resolved)]
        return new, last[1]

    return reload
