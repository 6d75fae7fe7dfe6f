"""devplug_fake: configurable fake devices with fault injection, for demos and CI.

Run it as ``devplug-fake`` (or ``python -m devplug_fake``); use :class:`FakePlugin` directly
to put fake resources next to real ones in a test.
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``devplug-fake``: serve the fake resources until SIGTERM / SIGINT.

    SIGHUP re-reads ``--config``: a resource whose configuration is unchanged keeps its plugin
    object, so only the changed ones are restarted.
    """
    from devplug import run

    plugins: dict[FakeResource, FakePlugin] = {}

    def build(settings: FakeSettings) -> list[FakePlugin]:
        kept = {r: plugins.get(r) or FakePlugin(r) for r in settings.resource_configs()}
        plugins.clear()
        plugins.update(kept)
        return list(kept.values())

    return run(build, settings_cls=FakeSettings, argv=argv, prog="devplug-fake")
