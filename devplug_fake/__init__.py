"""devplug_fake: configurable fake devices with fault injection, for demos and CI.

Run it as ``devplug-fake`` (or ``python -m devplug_fake``); use :class:`FakePlugin` directly
to put fake resources next to real ones in a test.
"""

from __future__ import annotations

import typing

from devplug._lazy import lazy_names as _lazy_names

if typing.TYPE_CHECKING:
    from devplug_fake._config import (
        DeviceChange,
        FakeResource,
        FakeSettings,
        Faults,
        HealthFlap,
        Policy,
        StateFile,
    )
    from devplug_fake._plugin import FakePlugin, PolicyFakePlugin

__all__ = [
    "DeviceChange",
    "FakePlugin",
    "FakeResource",
    "FakeSettings",
    "Faults",
    "HealthFlap",
    "Policy",
    "PolicyFakePlugin",
    "StateFile",
    "main",
]

# Imported on first use, so that ``devplug-fake`` starts by importing this module alone and
# loads the framework inside main().
_HOMES = {
    "DeviceChange": "devplug_fake._config",
    "FakeResource": "devplug_fake._config",
    "FakeSettings": "devplug_fake._config",
    "Faults": "devplug_fake._config",
    "HealthFlap": "devplug_fake._config",
    "Policy": "devplug_fake._config",
    "StateFile": "devplug_fake._config",
    "FakePlugin": "devplug_fake._plugin",
    "PolicyFakePlugin": "devplug_fake._plugin",
}

if not typing.TYPE_CHECKING:  # type checkers read the imports above; a misspelt name stays an error
    __getattr__, __dir__ = _lazy_names(__name__, _HOMES, __all__)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``devplug-fake``: serve the fake resources until SIGTERM / SIGINT.

    SIGHUP re-reads ``--config``: a resource whose configuration is unchanged keeps its plugin
    object, so only the changed ones are restarted.
    """
    from devplug import install_signals

    install_signals("devplug-fake")  # first: a Ctrl-C from here on is one line, never a traceback
    from devplug import run
    from devplug_fake._config import FakeSettings
    from devplug_fake._plugin import FakePlugin

    plugins: dict[FakeResource, FakePlugin] = {}

    def build(settings: FakeSettings) -> list[FakePlugin]:
        kept = {r: plugins.get(r) or FakePlugin(r) for r in settings.resource_configs()}
        plugins.clear()
        plugins.update(kept)
        return list(kept.values())

    return run(build, settings_cls=FakeSettings, argv=argv, prog="devplug-fake")
