"""``devplug demo`` (and ``--dra``) as a process: stopped by a signal at any moment, a plugin that
fails at once, a current directory that holds another ``devplug``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from devplug.testing._process import signal_child
from tests.chaos.signal_kit import until_main
from tests.support import wait_until

pytestmark = pytest.mark.anyio
DEVPLUG = str(Path(sys.executable).parent / "devplug")


@dataclass
class Demo:
    """A running demo: its process and what it printed so far."""

    process: Process
    out: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.out).replace("\r\n", "\n")

    def said(self, words: str) -> bool:
        return words in self.text

    async def ended(self, timeout: float) -> int:  # noqa: ASYNC109 - the test's bound
        """Its exit status, once it exited within ``timeout`` seconds."""
        await wait_until(lambda: self.process.returncode is not None, timeout=timeout, what="the demo's exit")
        assert self.process.returncode is not None
        return self.process.returncode

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        return b"".join([chunk async for chunk in self.process.stderr]).decode()


@asynccontextmanager
async def demo(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> AsyncIterator[Demo]:
    """``devplug demo ARGS`` with its stdout on a terminal (so it pauses 0.8 s after each main
    step, as for a person watching), read as it comes; killed at the end if still running."""
    main, child = os.openpty()
    environ = {**os.environ, "NO_COLOR": "1", **(env or {})}
    try:
        process = await anyio.open_process(
            [DEVPLUG, "demo", *args], stdout=child, stderr=subprocess.PIPE, cwd=cwd, env=environ
        )
    finally:
        os.close(child)
    running = Demo(process)

    async def read() -> None:
        while True:
            try:
                chunk = await anyio.to_thread.run_sync(os.read, main, 4096, abandon_on_cancel=True)
            except OSError:  # EIO: the terminal's other end is closed
                return
            if not chunk:
                return
            running.out.append(chunk.decode(errors="replace"))

    try:
        async with process, anyio.create_task_group() as tg:
            tg.start_soon(process.wait)
            tg.start_soon(read)
            try:
                yield running
            finally:
                if process.returncode is None:
                    signal_child(process, signal.SIGKILL)
                tg.cancel_scope.cancel()
    finally:
        os.close(main)


def gone(pid: int) -> bool:
    """No such process any more (a zombie still counts as there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# Moments, each a step printed first (None: as soon as main took the signals over, while the
# command's modules load).
MOMENTS = {
    "at-start": None,
    "child-started": "started devplug-fake",
    "mid-demo": "registered ",
}


@pytest.mark.parametrize("dra", [False, True], ids=["device-plugin", "dra"])
@pytest.mark.parametrize(
    ("moment", "signum"),
    [
        ("at-start", signal.SIGINT),
        ("child-started", signal.SIGTERM),
        ("mid-demo", signal.SIGINT),
        ("mid-demo", signal.SIGTERM),
    ],
)
async def test_a_signal_ends_the_demo_at_once_and_cleanly(
    dra: bool, moment: str, signum: signal.Signals
) -> None:
    """Status 130 and one line, the plugin stopped, the work directory removed, whatever the
    moment. (It used to hang for 20 s or for ever, leave devplug-fake running and the directory
    behind, or print a 50-line KeyboardInterrupt traceback.)"""
    async with demo(*(["--dra"] if dra else [])) as running:
        step = MOMENTS[moment]
        if step is None:
            await until_main(running.process.pid, 30)
        else:
            await wait_until(
                lambda: running.said(step), timeout=30, what=lambda: f"{step!r} in {running.text!r}"
            )
        signal_child(running.process, signum)
        status = await running.ended(timeout=5)
        err = await running.stderr()
    assert (status, err) == (130, "devplug demo: interrupted\n"), running.text
    pid = re.search(r"\(pid (\d+)\)", running.text)
    if step is not None:
        assert pid is not None, running.text
    if pid is not None:
        assert gone(int(pid.group(1))), f"the plugin (pid {pid.group(1)}) is still running"
    workdir = re.search(r"work directory (\S+)", running.text)
    if workdir is not None:
        assert not Path(workdir.group(1)).exists()


@pytest.fixture
def broken_fake(short_dir: Path) -> Path:
    """A directory whose devplug_fake fails to import (for PYTHONPATH): the plugin dies at once."""
    package = short_dir / "broken" / "devplug_fake"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("this devplug_fake is broken")\n')
    return package.parent


@pytest.mark.parametrize("dra", [False, True], ids=["device-plugin", "dra"])
async def test_a_plugin_that_fails_at_once_is_reported_with_its_error(dra: bool, broken_fake: Path) -> None:
    """The demo sees the plugin exit and shows why (it used to wait 15 s for a registration first)."""
    path = os.pathsep.join(filter(None, [str(broken_fake), os.environ.get("PYTHONPATH")]))
    async with demo(*(["--dra"] if dra else []), env={"PYTHONPATH": path}) as running:
        status = await running.ended(timeout=10)
        err = await running.stderr()
    assert status == 1, err
    lines = err.splitlines()
    name = "devplug demo --dra" if dra else "devplug demo"
    why = "the plugin exited with status 1 (ImportError: this devplug_fake is broken)"
    assert lines[0] == f"{name} failed: {why}"
    assert "ImportError: this devplug_fake is broken" in lines[-1]  # the plugin's own output follows
    workdir = re.search(r"work directory (\S+)", running.text)
    assert workdir is not None
    assert not Path(workdir.group(1)).exists()


@pytest.mark.parametrize("dra", [False, True], ids=["device-plugin", "dra"])
async def test_a_devplug_folder_in_the_current_directory_is_not_imported(dra: bool, short_dir: Path) -> None:
    """``python -m`` puts the current directory first on the import path: the plugin runs
    elsewhere, so a checkout or a project folder named devplug does not replace the package."""
    shadow = short_dir / "devplug"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("not the devplug package")\n')
    async with demo(*(["--dra"] if dra else []), cwd=short_dir) as running:
        status = await running.ended(timeout=60)
        err = await running.stderr()
    assert status == 0, err
    assert "nothing was left behind" in running.text
