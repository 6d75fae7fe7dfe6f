from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest

from devplug._core.watch import DirWatcher

pytestmark = pytest.mark.anyio


async def test_changes_wake_waiters_and_survive_directory_recreation(short_dir: Path) -> None:
    watched = short_dir / "dp"
    watched.mkdir()  # the kubelet's to make
    watcher = DirWatcher(watched)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        assert watcher.missing == ()
        with anyio.fail_after(2):
            gen = watcher.generation
            (watched / "kubelet.sock").touch()
            await watcher.changed_after(gen)
            found = await watcher.wait_for(lambda: (watched / "kubelet.sock").exists() or None)
            assert found is True
        # The whole directory removed: it is waited for, not made again, and watching resumes
        # on the new one once the kubelet makes it.
        shutil.rmtree(watched)
        with anyio.fail_after(2):
            await watcher.wait_for(lambda: True if watcher.missing == (watched,) else None)
        assert not watched.exists()
        watched.mkdir()
        with anyio.fail_after(2):
            await watcher.wait_present(watched)
            gen = watcher.generation
            (watched / "again").touch()
            await watcher.changed_after(gen)
            assert await watcher.wait_for(lambda: watcher.creations(watched / "again") or None) >= 1
        tg.cancel_scope.cancel()


async def test_wait_for_rechecks_state_not_events(short_dir: Path) -> None:
    watcher = DirWatcher(short_dir)
    target = short_dir / "x"
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        target.touch()  # already true before waiting: returns at once, no event needed
        with anyio.fail_after(1):
            assert await watcher.wait_for(lambda: target.exists() or None) is True
        results: list[str] = []

        async def wait_gone() -> None:
            await watcher.wait_for(lambda: None if target.exists() else True)
            results.append("gone")

        tg.start_soon(wait_gone)
        await anyio.sleep(0.05)
        (short_dir / "unrelated").touch()  # a change that does not satisfy the check
        await anyio.sleep(0.05)
        assert results == []
        os.unlink(target)
        with anyio.fail_after(1):
            while not results:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
