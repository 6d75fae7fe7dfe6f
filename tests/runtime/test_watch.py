from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest

from devplug._runtime.watch import DirWatcher
from tests.support import never_within, wait_until

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
        await never_within(lambda: results, 0.05, what="the waiter woken by an unrelated change")
        os.unlink(target)
        await wait_until(lambda: results, timeout=1)
        tg.cancel_scope.cancel()


async def test_a_missing_directory_is_found_through_ancestors_that_come_and_go(short_dir: Path) -> None:
    target = short_dir / "a" / "b" / "dp"
    watcher = DirWatcher(target)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)  # started although nothing is there
        assert watcher.missing == (target,)
        (short_dir / "a").mkdir()  # the watch moves down to a/ ...
        await anyio.sleep(0.05)
        (short_dir / "a").rmdir()  # ... and back up when a/ goes
        await never_within((short_dir / "a").exists, 0.05, what="a/ made by the watcher")
        os.makedirs(target)
        with anyio.fail_after(2):
            await watcher.wait_present(target)
        assert watcher.missing == ()
        gen = watcher.generation
        (target / "kubelet.sock").touch()
        with anyio.fail_after(2):
            await watcher.changed_after(gen)
        assert watcher.creations(target / "kubelet.sock") >= 1
        tg.cancel_scope.cancel()


async def test_a_watched_directory_stays_watched_after_serving_as_an_ancestor(short_dir: Path) -> None:
    """The missing sub/ is waited for through the watch of its parent, itself watched: that
    watch is kept once sub/ is there."""
    sub = short_dir / "sub"
    watcher = DirWatcher(short_dir, sub)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        assert watcher.missing == (sub,)
        sub.mkdir()
        with anyio.fail_after(2):
            await watcher.wait_present(sub)
        for directory in (short_dir, sub):
            before, gen = watcher.creations(directory / "x"), watcher.generation
            (directory / "x").touch()
            with anyio.fail_after(2):
                await watcher.changed_after(gen)
            assert watcher.creations(directory / "x") == before + 1
        tg.cancel_scope.cancel()
