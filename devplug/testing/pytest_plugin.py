"""pytest plugin of devplug: a ``fake_kubelet`` fixture and the asyncio anyio backend.

Registered as the ``pytest11`` entry point ``devplug``, so installing devplug enables it. Tests
that use the fixture are async tests marked ``@pytest.mark.anyio`` (anyio's pytest plugin).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.testing import FakeKubelet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["anyio_backend", "devplug_event_loop", "fake_kubelet"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """grpc.aio runs on asyncio only; override this fixture to pass backend options."""
    return "asyncio"


@pytest.fixture(scope="session")
async def devplug_event_loop(anyio_backend: object) -> AsyncIterator[None]:
    """Keep one event loop for every test that uses gRPC, from the first one on.

    grpc.aio binds its process-wide completion poller to the loop it first runs on; when a
    later test runs on a new loop while objects of the old one linger, its callbacks land on a
    closed loop ("Event loop is closed", and at worst a crash). anyio keeps its test runner,
    and so its loop, alive while a fixture of wider scope holds it: this one does.

    It needs a session-scoped ``anyio_backend``. This plugin defines one, but anyio's own
    module-scoped default may take precedence (plugin order); then define it in your
    ``conftest.py``::

        @pytest.fixture(scope="session")
        def anyio_backend():
            return "asyncio"
    """
    yield  # noqa: PT022 - the open generator is what holds the loop


@pytest.fixture
async def fake_kubelet(devplug_event_loop: None) -> AsyncIterator[FakeKubelet]:
    """A started ``FakeKubelet`` (kubelet >= 1.26 behaviour) with the plugin watcher on.

    Its directories are ``<root>/device-plugins`` and ``<root>/plugins_registry`` under a fresh
    short directory in ``/tmp`` (pytest's ``tmp_path`` is often too long for unix socket
    paths, which are limited to 107 bytes), removed afterwards.
    """
    root = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        kubelet = FakeKubelet(root / "device-plugins", plugins_registry_dir=root / "plugins_registry")
        async with kubelet:
            yield kubelet
    finally:
        shutil.rmtree(root, ignore_errors=True)
