"""Signals of a serving process: SIGTERM / SIGINT stop it, SIGHUP reloads, SIGUSR1 dumps state."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import anyio
import structlog

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

log = structlog.get_logger("devplug.runner")


async def until_signalled(
    main: Callable[[], Awaitable[None]],
    *,
    reload: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    dump: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Run ``main`` until it returns, or until the first SIGTERM / SIGINT cancels it.

    The signals stay caught until ``main`` has finished its clean-up: a second SIGTERM or Ctrl-C
    while sockets are being removed is logged and changes nothing (with Python's default
    handlers back in place it would kill the process half-way, or raise KeyboardInterrupt into
    the clean-up). SIGHUP starts ``reload`` (without one it is logged and ignored), SIGUSR1 logs
    ``dump()``. An exception of ``main`` is raised as it is, not in an exception group.
    """
    failure: Exception | None = None
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    with anyio.open_signal_receiver(*signals) as received:
        async with anyio.create_task_group() as tg:
            serving = anyio.CancelScope()

            async def serve() -> None:
                nonlocal failure
                try:
                    with serving:
                        await main()
                except Exception as exc:
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()  # done: stop listening

            tg.start_soon(serve)
            async for signum in received:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    if reload is None:
                        log.warning(
                            "reload_unavailable",
                            signal=name,
                            note="this process has no configuration to re-read",
                        )
                    else:
                        log.info("signal_received", signal=name, action="reload")
                        tg.start_soon(reload)
                elif signum == signal.SIGUSR1:
                    if dump is not None:
                        log.info("debug_state", **dump())
                elif serving.cancel_called:
                    log.info("signal_received", signal=name, action="already stopping")
                else:
                    log.info("signal_received", signal=name)
                    serving.cancel()
    if failure is not None:
        raise failure
