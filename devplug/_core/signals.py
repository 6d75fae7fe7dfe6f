"""Signals of a serving process: SIGTERM / SIGINT stop it, SIGHUP reloads, SIGUSR1 dumps state."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import anyio
import structlog

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from anyio.abc import TaskGroup

log = structlog.get_logger("devplug.runner")


async def handle_signals(
    tg: TaskGroup,
    *,
    reload: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    dump: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Cancel ``tg`` on the first SIGTERM or SIGINT; SIGHUP starts ``reload`` in ``tg``, SIGUSR1
    logs ``dump()``. Without ``reload``, SIGHUP is logged and ignored."""
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    with anyio.open_signal_receiver(*signals) as received:
        async for signum in received:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                if reload is None:
                    log.warning(
                        "reload_unavailable", signal=name, note="this process has no configuration to re-read"
                    )
                    continue
                log.info("signal_received", signal=name, action="reload")
                tg.start_soon(reload)
            elif signum == signal.SIGUSR1:
                if dump is not None:
                    log.info("debug_state", **dump())
            else:
                log.info("signal_received", signal=name)
                tg.cancel_scope.cancel()
                return
