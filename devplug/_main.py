"""The blocking entry point every command shares: options, logging, then the chosen API's runtime.

``api=device-plugin`` serves through :class:`devplug._device_plugin.runner.Runner`; ``api=dra`` through
:class:`devplug._dra.driver.DraDriver`, imported only then (its API client is not needed, nor
loaded, by a device plugin).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from devplug._device_plugin.runner import DevicePluginService, Plugins, PluginSource, Runner
from devplug._extras import require_dra
from devplug._names import is_dns_subdomain
from devplug._runtime.host import Host, as_list
from devplug._runtime.signals import install_signals, run_async
from devplug._settings_groups import BOTH_APIS
from devplug.errors import ConfigError
from devplug.logging import configure as configure_logging
from devplug.plugin import DevicePlugin
from devplug.settings import Settings, load_settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from devplug._runtime.host import Readiness, Reload

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
    SIGHUP then reads them again: when they changed, ``plugins`` (a factory) is called with the
    new settings, and the resources whose plugin object is new are restarted (a factory that
    returns the same object for an unchanged resource keeps it serving), under either API.
    With ``api=dra`` the plugins are served as one DRA driver (:mod:`devplug.dra`). ``plugins``
    may be a factory taking the settings (a subclass of :class:`Settings` carries a backend's
    own options). ``api``, when given, overrides the
    options' (:func:`devplug.dra.run` sets it); ``driver_name`` is the default of theirs.
    """
    name = prog or "devplug"
    install_signals(name)  # from here on a SIGTERM / Ctrl-C never ends in a traceback
    reload: Reload | None = None
    try:
        read_options = settings is None
        if settings is None:
            settings = load_settings(settings_cls, argv, prog=prog)
            configure_logging(settings.log_format, settings.log_level)
        settings = _with_defaults(settings, api=api, driver_name=driver_name)
        resolved = _resolve(plugins, settings)
        if read_options and not isinstance(resolved, PluginSource):
            # (a plugin source changes the set by itself)
            defaults = partial(_with_defaults, api=api, driver_name=driver_name)
            first = (settings, as_list(resolved))
            reload = _reloader(plugins, settings_cls, argv, prog, defaults=defaults, first=first)
        run_async(host_for(resolved, settings, reload=reload).run)
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
    if api is not None and not (api == "dra" and settings.api == BOTH_APIS):
        update["api"] = api  # (devplug.dra.run's "dra" keeps both APIs where both are asked)
    if driver_name is not None and settings.driver_name is None:
        if not is_dns_subdomain(driver_name, 63):
            raise ConfigError(f"invalid setting --driver-name: {driver_name!r} is not a DNS subdomain")
        update["driver_name"] = driver_name
    return settings.model_copy(update=update) if update else settings


def host_for(
    plugins: Plugins,
    settings: Settings,
    *,
    readiness: Iterable[Readiness] = (),
    reload: Reload | None = None,
) -> Host:
    """The host that serves ``plugins`` through the API ``settings.api`` names.

    Raises:
        ConfigError: ``api=dra`` with a :class:`PluginSource` (a driver serves a fixed set), no
            node name, no plugins.
        MissingExtraError: ``api=dra`` without the ``dra`` extra.
    """
    if settings.withhold_device_plugin_pods and settings.api == "device-plugin":
        raise ConfigError(
            "--withhold-device-plugin-pods is for --api dra (a node moving to DRA); "
            "--api device-plugin,dra keeps the holders of both APIs by itself"
        )
    if settings.api == "device-plugin":
        return Runner(plugins, settings, readiness=readiness, reload=reload)
    require_dra()
    from devplug._dra.driver import DraDriver

    if isinstance(plugins, PluginSource):
        raise ConfigError("a PluginSource cannot be served as a DRA driver; pass the plugins themselves")
    if settings.api == "dra":
        return DraDriver(as_list(plugins), settings, readiness=readiness, reload=reload)
    return DualHost(as_list(plugins), settings, readiness=readiness, reload=reload)


class DualHost(Host):
    """Serves plugins through the device-plugin API and DRA at once (``api=device-plugin,dra``),
    with one ledger of who holds which device.

    ``plugins`` serve both APIs; a backend whose DRA devices come from other objects (NVIDIA's
    DRA plugin beside its device-plugin resources) passes those as ``dra_plugins``: the ledger
    matches the two sides' devices by resource name and device ID (a device ID unique among the
    DRA devices matches under any resource name; ``<id>::<n>`` names device ``<id>``).

    ``dra`` is the DRA service (its driver, inventory, publisher, checkpoint), ``device_plugin``
    the device-plugin one (its ``resources``), ``ledger`` the holders: a device a pod holds
    through one API is withheld from the other until it is free.

    Raises:
        ConfigError: as :class:`devplug.dra.DraDriver` (no node name, no plugins, ...).
        MissingExtraError: without the ``dra`` extra.
    """

    def __init__(
        self,
        plugins: Sequence[DevicePlugin],
        settings: Settings,
        *,
        dra_plugins: Sequence[DevicePlugin] | None = None,
        readiness: Iterable[Readiness] = (),
        reload: Reload | None = None,
    ) -> None:
        require_dra()
        from devplug._dra.driver import DraService
        from devplug._runtime.ledger import Ledger

        if dra_plugins is not None and reload is not None:
            raise ValueError("reload cannot be combined with dra_plugins (one plugin set per reload)")
        self.ledger = Ledger()
        self.dra = DraService(
            dra_plugins if dra_plugins is not None else plugins, settings, ledger=self.ledger
        )
        self.device_plugin = DevicePluginService(list(plugins), settings, ledger=self.ledger)
        super().__init__([self.dra, self.device_plugin], settings, readiness=readiness, reload=reload)


async def serve(
    plugins: Plugins,
    settings: Settings | None = None,
    *,
    handle_signals: bool = True,
    readiness: Iterable[Readiness] = (),
    reload: Reload | None = None,
) -> None:
    """Serve ``plugins`` until cancelled (or SIGTERM / SIGINT), through the API ``settings.api``
    chooses (the device-plugin API by default, ``dra`` for a DRA driver).

    ``plugins`` is one :class:`DevicePlugin`, several, or (device-plugin API only) a
    :class:`PluginSource` that adds and removes resources at run time. Needs the asyncio backend
    (grpc.aio runs on asyncio). ``readiness`` are extra conditions of ``/readyz``; ``reload``
    what SIGHUP calls for a new configuration (see :class:`Runner`).

    Raises:
        ConfigError: a configuration the chosen API refuses (one line's worth).
    """
    host = host_for(plugins, settings or Settings(), readiness=readiness, reload=reload)
    await host.run(handle_signals=handle_signals)


def _resolve(plugins: Plugins | Callable[[S], Plugins], settings: S) -> Plugins:
    return plugins(settings) if callable(plugins) and not isinstance(plugins, DevicePlugin) else plugins


def _reloader(
    plugins: Plugins | Callable[[S], Plugins],
    settings_cls: type[S],
    argv: list[str] | None,
    prog: str | None,
    *,
    defaults: Callable[[S], S],
    first: tuple[S, list[DevicePlugin]],
) -> Reload:
    """Re-read the options the way :func:`run` read them at start (``defaults``: what ``run``'s
    own arguments set, applied again); ``first`` is what is served now: unchanged options keep
    those plugin objects, so nothing restarts."""
    last: list[Any] = list(first)

    def reload() -> tuple[Settings, DevicePlugin | Iterable[DevicePlugin]]:
        new = defaults(load_settings(settings_cls, argv, prog=prog))
        if new == last[0] and last[1] is not None:
            return new, last[1]  # nothing changed: the same objects, nothing restarts
        resolved = _resolve(plugins, new)
        if isinstance(resolved, PluginSource):
            raise ConfigError("the reloaded configuration yields a plugin source; restart the process")
        last[:] = [new, as_list(resolved)]
        return new, last[1]

    return reload
