"""Plugins and helpers for the tests (importable by subprocesses as ``tests.support``)."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar, cast

import anyio
from anyio.abc import Process

import devplug
import devplug.testing
from devplug import ContainerAllocation, Device, DevicePlugin, DeviceSpec, Health, Plugins, Settings
from devplug.testing._process import signal_child

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


class Widgets(DevicePlugin):
    """Four widgets by default; tests change the set with :meth:`set_devices`."""

    resource_name = "example.com/widget"

    def __init__(self, resource: str | None = None, devices: Sequence[Device] | None = None) -> None:
        if resource is not None:
            self.resource_name = resource
        self.devices: list[Device] = list(
            devices if devices is not None else [Device(id=f"w{i}") for i in range(4)]
        )
        self._changed = anyio.Event()
        self.allocations: list[list[str]] = []
        self.fail_allocate: str | None = None

    def set_devices(self, devices: Sequence[Device]) -> None:
        self.devices = list(devices)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def set_health(self, device_id: str, health: Health) -> None:
        self.set_devices([d.with_health(health) if d.id == device_id else d for d in self.devices])

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        while True:
            changed = self._changed
            yield list(self.devices)
            await changed.wait()

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        ids = [d.id for d in devices]
        self.allocations.append(ids)
        if self.fail_allocate:
            raise RuntimeError(self.fail_allocate)
        return ContainerAllocation(
            envs={"WIDGETS": ",".join(ids)},
            devices=tuple(DeviceSpec.rw("/dev/null", f"/dev/{i}") for i in ids),
            cdi_devices=tuple(f"example.com/widget={i}" for i in ids),
        )


class PickyWidgets(Widgets):
    """Offers preferred allocation and pre-start; both can be made to misbehave."""

    def __init__(self) -> None:
        super().__init__()
        self.preferred_answer: list[str] | Exception | None = None
        self.pre_started: list[list[str]] = []

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str] | None:
        if isinstance(self.preferred_answer, Exception):
            raise self.preferred_answer
        if self.preferred_answer is not None:
            return self.preferred_answer
        return [d.id for d in reversed(available)][:size]  # deliberately not the default order

    async def pre_start_container(self, devices: Sequence[Device]) -> None:
        self.pre_started.append([d.id for d in devices])


def settings_for(directory: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "device_plugin_dir": directory / "device-plugins",
        "plugins_registry_dir": directory / "plugins_registry",
        "retry_initial": 0.02,
        "retry_max": 0.2,
        "shutdown_grace": 0.2,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(plugins: Plugins, settings: Settings) -> AsyncIterator[devplug.Runner]:
    """Run devplug in the background of a test; cancelled (as on SIGTERM) on exit."""
    async with devplug.testing.serving(plugins, settings=settings) as runner:
        yield runner


async def _check(predicate: Callable[[], T | Awaitable[T]]) -> T:
    value = predicate()
    if inspect.isawaitable(value):
        return await value
    return value


Described = str | Callable[[], str] | None
"""What a wait is for, in a failure message: words, words made when it fails, or the predicate's own."""


def _described(predicate: Callable[[], object], what: Described) -> str:
    """``what``, or else the function's name, or a lambda's source line (it says what it checks)."""
    if callable(what):
        return what()
    if what is not None:
        return what
    name: str = getattr(predicate, "__qualname__", repr(predicate))
    if not name.endswith("<lambda>"):
        return name
    try:
        source = " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        return name
    return source if len(source) <= 200 else source[:197] + "..."


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 500 else text[:497] + "..."


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 5.0,  # noqa: ASYNC109 - a test's deadline, reported in the failure
    interval: float = 0.01,
    what: Described = None,
) -> T:
    """Poll ``predicate`` (sync or async) until it returns something true, and return that.

    For state with no event to wait on: a file, a log line, a counter of another server. Fails
    with an AssertionError naming ``what`` was awaited (by default the predicate's source; a
    callable is called then, to say what it saw) and the last value seen when ``timeout`` seconds
    pass first.
    """
    last: object = None
    with anyio.move_on_after(timeout):
        while True:
            last = await _check(predicate)
            if last:
                return cast("T", last)
            await anyio.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:g} s waiting for {_described(predicate, what)} (last: {_shown(last)})"
    )


async def never_within(
    predicate: Callable[[], object],
    seconds: float,
    *,
    interval: float = 0.01,
    what: Described = None,
) -> None:
    """Poll ``predicate`` (sync or async) for ``seconds``, failing as soon as it is true.

    For what must not happen: a restart, a second warning, a write. Checked once more at the end,
    so that a ``predicate`` true by then fails however slow the polling was. The AssertionError
    names ``what`` happened (by default the predicate's source) and its value.
    """
    start = anyio.current_time()
    deadline = start + seconds
    while True:
        value = await _check(predicate)
        if value:
            after = anyio.current_time() - start
            raise AssertionError(
                f"{_described(predicate, what)} happened after {after:.2f} s"
                f" (it must not within {seconds:g} s): {_shown(value)}"
            )
        left = deadline - anyio.current_time()
        if left <= 0:
            return
        await anyio.sleep(min(interval, left))


@asynccontextmanager
async def logged_process(
    module: str,
    args: Sequence[str],
    log: Path | None = None,
    *,
    env: dict[str, str] | None = None,
    umask: int = -1,
) -> AsyncIterator[Process]:
    """``python -m MODULE --log-format json ARGS``, its log in ``log`` (or discarded).

    At the end the process gets SIGTERM, and must exit with status 0 within 5 s.
    """
    command = [sys.executable, "-m", module, "--log-format", "json", *args]
    with open(log or os.devnull, "w") as out:  # noqa: ASYNC230 - opened once, before the process
        process = await anyio.open_process(
            command, stdout=subprocess.DEVNULL, stderr=out, env=env, cwd=ROOT, umask=umask
        )
        async with process:
            try:
                yield process
            finally:
                if process.returncode is None:
                    signal_child(process, signal.SIGTERM)
                    with anyio.fail_after(5):
                        code = await process.wait()
                    assert code == 0, log.read_text()[-3000:] if log else f"exit status {code}"
