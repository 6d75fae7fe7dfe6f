"""Signals of a devplug process, from the first line of ``main`` to exit.

SIGTERM / SIGINT stop it, SIGHUP reloads, SIGUSR1 dumps state. One handler, installed by
:func:`install_signals` at the very start of every command's ``main``, stays in place until exit (the
event loop's own signal handlers are not used: removing them puts the default action back, and
a second SIGTERM during the last clean-up would then kill the process). What a signal does
depends on the moment:

* before serving starts, outside the event loop (reading options, imports done lazily,
  discovery): the first one raises :class:`Interrupted` (a ``SystemExit`` with status 130, so
  ``with`` blocks and ``finally`` clauses clean up and no traceback is printed); later ones are
  ignored;
* before serving starts, inside :func:`run_async`: the first one cancels the start-up, and
  :class:`Interrupted` is raised once the event loop is closed;
* while serving (:func:`until_signalled`): the first one cancels serving, whose clean-up then
  runs to the end; later ones are logged (``signal_received``, ``already stopping``);
* after serving: ignored; the process exits 0.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    import socket
    from collections.abc import Awaitable, Callable, Coroutine, Iterator
    from types import FrameType

# Nothing heavier than the standard library's signal support at import: install() is the first
# line of every command's main, and a signal before it ends the process the default way.

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
INTERRUPTED = 130
"""The exit status of a process stopped before it served anything (128 + SIGINT, as a shell
reports a Ctrl-C)."""


class Interrupted(SystemExit):
    """SIGTERM / SIGINT before serving started: unwinds like SystemExit (clean-ups run, no
    traceback) and exits with status 130."""

    def __init__(self) -> None:
        super().__init__(INTERRUPTED)


class _State:
    prog = "devplug"
    installed = False
    served = False
    """Serving has started: from then on a stop signal never raises."""
    interrupted = False
    """The first stop signal before serving has been acted on: later ones are ignored."""
    stop_requested = False
    """A stop signal came inside :func:`run_async` before serving started."""
    targets: list[tuple[asyncio.AbstractEventLoop, Callable[[int], None]]] = []  # noqa: RUF012


_state = _State()


def install_signals(prog: str) -> None:
    """Take SIGTERM and SIGINT over for the rest of the process (call it first thing in ``main``).

    Does nothing outside the main thread, where signal handlers cannot be set.
    """
    _state.prog = prog
    if threading.current_thread() is not threading.main_thread():
        return
    if not _state.installed:
        # The interpreter's finalization puts the default action back for every Python
        # handler (not for an ignored signal): a signal in the last milliseconds would kill
        # the process after its clean-up, with 128 + the signal instead of its status. So
        # before any handler: a signal caught now may already end the process.
        atexit.register(_ignore_stop_signals)
    # Both handlers at once, with the two signals held back meanwhile: a SIGINT just after
    # SIGTERM's handler was set would meet Python's own (a KeyboardInterrupt traceback).
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, _handler)
        _state.installed = True
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _handler(signum: int, frame: FrameType | None) -> None:
    # Runs in the main thread between two bytecodes of whatever it was doing: only hand the
    # signal on (to the event loop), or raise once.
    if _state.targets:
        if signum in STOP_SIGNALS and not _state.served:
            # Decided now: the loop may run the callback only after serving has started.
            _state.stop_requested = True
        loop, callback = _state.targets[-1]
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(callback, signum)
        return
    if signum not in STOP_SIGNALS or _state.served or _state.interrupted:
        return
    _state.interrupted = True
    with contextlib.suppress(OSError):
        os.write(2, f"{_state.prog}: interrupted\n".encode())
    raise Interrupted


@contextlib.contextmanager
def _routed(callback: Callable[[int], None], signums: tuple[int, ...]) -> Iterator[None]:
    """Hand ``signums`` to ``callback`` in the running event loop for the block's duration."""
    import asyncio
    import socket

    loop = asyncio.get_running_loop()
    previous = {s: signal.getsignal(s) for s in signums}
    wake = None
    if not _state.targets:
        # A signal delivered to another thread trips Python's flag but does not interrupt the
        # loop's wait: the wake-up descriptor does.
        wake = socket.socketpair()
        for end in wake:
            end.setblocking(False)
        old_fd = signal.set_wakeup_fd(wake[1].fileno(), warn_on_full_buffer=False)
        loop.add_reader(wake[0].fileno(), _drain, wake[0])
    _state.targets.append((loop, callback))
    try:
        for signum in signums:
            signal.signal(signum, _handler)
        yield
    finally:
        _state.targets.remove((loop, callback))
        if wake is not None:
            signal.set_wakeup_fd(old_fd)
            loop.remove_reader(wake[0].fileno())
            for end in wake:
                end.close()
        for signum, handler in previous.items():
            # Ours stays for good once installed; a library caller gets its own back.
            if handler is not _handler and not (_state.installed and signum in STOP_SIGNALS):
                signal.signal(signum, handler)


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while sock.recv(256):
            pass


def run_async(main: Callable[[], Awaitable[None]]) -> None:
    """``anyio.run(main)`` (asyncio) with the stop signals routed into it.

    Raises:
        Interrupted: a stop signal came before serving started; ``main`` was cancelled and its
            clean-up has run. The one line saying so is printed here.
    """
    import anyio

    if _state.interrupted and not _state.served:
        # A stop signal came before, and its Interrupted was lost on the way: raised where
        # Python swallows exceptions (a finalizer, a weakref callback: "Exception ignored"),
        # with every later signal ignored. Starting now would serve with no way to stop it.
        raise Interrupted
    stopped = False

    async def guarded() -> None:
        scope = anyio.CancelScope()

        def on_signal(signum: int) -> None:
            nonlocal stopped
            if stopped or not _state.stop_requested:
                return  # after serving started: until_signalled's, or the clean-up is done
            stopped = True
            scope.cancel()

        with _routed(on_signal, STOP_SIGNALS), scope:
            if _state.interrupted:  # the same, between the test above and the routing
                _state.stop_requested = True
                on_signal(signal.SIGTERM)
            try:
                await main()
            finally:
                # Calls still streaming on a stopped server would be cancelled by the loop's
                # close, and grpc prints a traceback for each.
                from devplug._grpc_calls import settle_server_calls

                with anyio.CancelScope(shield=True):
                    await settle_server_calls()

    anyio.run(guarded, backend="asyncio")
    if stopped and not _state.served:
        if not _state.interrupted:
            _state.interrupted = True
            print(f"{_state.prog}: interrupted", flush=True, file=sys.stderr)
        raise Interrupted


async def until_signalled(
    main: Callable[[], Awaitable[None]],
    *,
    reload: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    dump: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Run ``main`` until it returns, or until the first SIGTERM / SIGINT cancels it.

    The signals stay caught until ``main`` has finished its clean-up: a second SIGTERM or Ctrl-C
    while sockets are being removed is logged and changes nothing. SIGHUP starts ``reload``
    (without one it is logged and ignored), SIGUSR1 logs ``dump()``. An exception of ``main``
    is raised as it is, not in an exception group.
    """
    import anyio
    import structlog

    log = structlog.get_logger("devplug.runner")
    failure: Exception | None = None
    _state.served = True
    async with anyio.create_task_group() as tg:
        serving = anyio.CancelScope()

        def on_signal(signum: int) -> None:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                if reload is None:
                    log.warning(
                        "reload_unavailable", signal=name, note="this process has no configuration to re-read"
                    )
                elif not tg.cancel_scope.cancel_called:
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

        with _routed(on_signal, (*STOP_SIGNALS, signal.SIGHUP, signal.SIGUSR1)):
            try:
                with serving:
                    await main()
            except Exception as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()  # a reload still running stops with it
    if failure is not None:
        raise failure
