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
