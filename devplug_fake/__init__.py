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
    """Entry point of ``devplug-fake``: serve the fake resources until SIGTERM / SIGINT."""
    from devplug import run

    return run(
        lambda settings: [FakePlugin(r) for r in settings.resource_configs()],
        settings_cls=FakeSettings,
        argv=argv,
        prog="devplug-fake",
    )
