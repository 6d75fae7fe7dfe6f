"""Awaiting a grpc.aio call inside anyio cancel scopes.

grpc.aio answers the cancellation of a unary call (unary-unary, stream-unary) with a
``CancelledError`` of its own: the task that runs the call swallows the cancellation, winds
the call down and raises a fresh ``CancelledError()`` in the caller. That fresh error lacks the
message anyio marks its own cancellations with, so the cancel scope that asked for it (a
``move_on_after``, a scope cancelled on purpose, a task group's) does not recognise it: the
scope lets it through, and the task group around it ends as if cancelled from outside.
A fake kubelet lost its plugin watcher that way when a registration socket was deleted while
the registration status was being sent.

:func:`await_call` awaits a call so that a cancelled scope sees its own cancellation.

On the server side, ``server.stop()`` can return while the tasks of calls that were still
streaming run on. The event loop cancels them when it closes, and grpc.aio prints a
``CancelledError`` traceback for each such task. A stop signal landing just as the kubelet
opened a ListAndWatch stream did that once. :func:`settle_server_calls` ends those tasks first,
the way grpc ends a cancelled call, without printing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from collections.abc import Awaitable

T = TypeVar("T")


async def await_call(call: Awaitable[T]) -> T:
    """The answer of a grpc.aio call; cancelled the way anyio's scopes expect when cancelled.

    Raises:
        grpc.aio.AioRpcError: the call failed.
    """
    try:
        return await call
    except anyio.get_cancelled_exc_class():
        # Inside a cancelled anyio scope this raises the scope's own cancellation (with its
        # message); a cancellation from outside anyio goes on as grpc raised it.
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise


# grpc.aio's names for its per-call tasks (cython/_cygrpc/aio/server.pyx.pxi): the task that
# runs the servicer method, and the task around it that prints a traceback when it is
# cancelled while it waits for that one.
_HANDLER_TASK_PREFIX = "HandleExceptions["
_WRAPPER_TASK_NAME = "rpc_task"


async def settle_server_calls(timeout: float = 1.0) -> int:  # noqa: ASYNC109 - a bound, not a deadline
    """End the grpc.aio server calls still running in this event loop; call it once every
    server has stopped, before the loop closes.

    Each call's method is cancelled (grpc logs that at debug level and winds the call down),
    then both its tasks are awaited for at most ``timeout`` seconds. Returns how many calls
    were still running.
    """
    import asyncio

    me = asyncio.current_task()
    running = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    handlers = [t for t in running if t.get_name().startswith(_HANDLER_TASK_PREFIX)]
    wrappers = [t for t in running if t.get_name() == _WRAPPER_TASK_NAME]
    for task in handlers:
        task.cancel()
    if handlers or wrappers:
        await asyncio.wait([*handlers, *wrappers], timeout=timeout)
    return len(handlers)
