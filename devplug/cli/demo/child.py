"""The plugin process a demo narrates: started away from the caller's files, watched, always stopped."""

from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from devplug.testing._process import PluginProcess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

GRACE = 0.5
"""Seconds a plugin gets to stop on SIGTERM when the demo ends early, before SIGKILL (its own
stop takes well under this; the demo promises to end within a second of Ctrl-C)."""


@asynccontextmanager
async def plugin_process(module: str, args: Sequence[str], workdir: Path) -> AsyncIterator[PluginProcess]:
    """``python -m MODULE ARGS`` in ``workdir``, its output in ``workdir/plugin.log``.

    The process runs in ``workdir``: ``-m`` puts the current directory first on the import
    path, so started from a directory holding a ``devplug/`` folder it would import that
    instead of the installed package. It runs in a session of its own, so a Ctrl-C at the
    terminal reaches the demo only, which then stops it. Wrap what waits on it in
    :meth:`PluginProcess.guard` to end that wait as soon as it exits. On the way out, however
    the block ends, it gets SIGTERM and :data:`GRACE` seconds, then SIGKILL.

    Raises:
        OSError: the interpreter could not be started.
    """
    plugin = PluginProcess(
        [sys.executable, "-m", module, *args], os.environ, workdir / "plugin.log", cwd=workdir
    )
    await plugin.start()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(plugin.watch)
            yield plugin
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await plugin.terminate(GRACE)
            await plugin.reap()
