"""pytest plugin of devplug: ``fake_kubelet``, ``fake_kube_api`` and ``fake_dra_kubelet`` fixtures,
and the asyncio anyio backend.

Registered as the ``pytest11`` entry point ``devplug``, so installing devplug enables it. Tests
that use the fixture are async tests marked ``@pytest.mark.anyio`` (anyio's pytest plugin).
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.testing import FakeKubelet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from devplug.testing import FakeKubeAPI

__all__ = ["anyio_backend", "devplug_event_loop", "fake_dra_kubelet", "fake_kube_api", "fake_kubelet"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """grpc.aio runs on asyncio only; override this fixture to pass backend options."""
    return "asyncio"


_NEEDS_SESSION_BACKEND = (
    "devplug's fake_kubelet fixture (devplug_event_loop) needs a session-scoped anyio_backend "
    "fixture, and the one in force is {scope}-scoped (anyio's own default wins over devplug's "
    "by plugin order). Add to your conftest.py:\n\n"
    '    @pytest.fixture(scope="session")\n'
    "    def anyio_backend():\n"
    '        return "asyncio"\n'
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Name the fix before pytest's ScopeMismatch would name only the symptom."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or "devplug_event_loop" not in getattr(item, "fixturenames", ()):
        return
    definitions = info.name2fixturedefs.get("anyio_backend")
    scope = getattr(definitions[-1], "scope", "session") if definitions else "session"
    if scope != "session":
        pytest.fail(_NEEDS_SESSION_BACKEND.format(scope=scope), pytrace=False)


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
    with _short_root() as root:
        async with FakeKubelet(
            root / "device-plugins", plugins_registry_dir=root / "plugins_registry"
        ) as kubelet:
            yield kubelet


_NODE = "node-1"


@pytest.fixture
async def fake_kube_api(devplug_event_loop: None) -> AsyncIterator[FakeKubeAPI]:
    """A started ``FakeKubeAPI`` with the Node ``node-1`` (needs the ``testing`` extra)."""
    # Imported here: the other fixtures need no extra, and this plugin is loaded in every session.
    from devplug.testing import FakeKubeAPI

    async with FakeKubeAPI() as api:
        api.add_node(_NODE)
        yield api


@pytest.fixture
async def fake_dra_kubelet(fake_kube_api: FakeKubeAPI) -> AsyncIterator[FakeKubelet]:
    """A started ``FakeKubelet`` in DRA mode for the node ``node-1`` of ``fake_kube_api``.

    Laid out as a kubelet's root, a fresh short directory in ``/tmp`` removed afterwards: its
    plugin watcher on ``plugins_registry``, and ``device-plugins``.
    ``serving_dra(plugin, fake_kube_api, fake_dra_kubelet)`` serves a driver there, with its
    socket in ``plugins/<driver>/`` and its CDI specs in ``cdi``.
    """
    with _short_root() as root:
        async with FakeKubelet(
            root / "device-plugins",
            plugins_registry_dir=root / "plugins_registry",
            dra=True,
            kube_api=fake_kube_api,
            node_name=_NODE,
        ) as kubelet:
            yield kubelet


@contextmanager
def _short_root() -> Iterator[Path]:
    # pytest's tmp_path is often too long for unix socket paths (107 bytes at most).
    root = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
