from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short temporary directory: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dpt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # Session scope, so that one event loop can serve the whole session (a conftest fixture
    # wins over the module-scoped default of anyio's own plugin).
    return "asyncio"


@pytest.fixture(autouse=True, scope="session")
def _one_event_loop(devplug_event_loop: None) -> None:
    """Every test of this suite shares one event loop (see devplug_event_loop)."""
