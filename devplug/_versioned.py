"""A value with a version number that waiters can follow: pure, anyio only.

Every place that keeps some state and wakes whoever waits for it to change (the device state, the
DRA inventory, the directory watch, the slice publisher, the fake kubelet and API server, the
NVIDIA health monitor) holds one :class:`Versioned` instead of swapping an ``anyio.Event`` by
hand. A reader remembers the version it last saw and asks for anything newer, so a change made
between two waits is never lost, and several changes in a row reach a slow reader as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Versioned"]

T = TypeVar("T")
R = TypeVar("R")


class Versioned(Generic[T]):
    """A value and a counter bumped by every :meth:`set` (version 0: as constructed).

    Waiting never misses a change: a waiter compares versions, not events. The event behind the
    waits is made on the first wait, so an instance may be built and set outside an event loop.
    """

    def __init__(self, value: T) -> None:
        self._value = value
        self._version = 0
        self._event: anyio.Event | None = None

    @property
    def value(self) -> T:
        """The value set last (the initial one until then)."""
        return self._value

    @property
    def version(self) -> int:
        """How many times the value was set (or bumped)."""
        return self._version

    def set(self, value: T) -> None:
        """Make ``value`` the current value at a new version and wake every waiter."""
        self._value = value
        self.bump()

    def bump(self) -> None:
        """A new version of the same value: waiters wake and look again at what they watch."""
        self._version += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def newer_than(self, version: int) -> T:
        """Wait until the version is past ``version`` and return the value then current."""
        while self._version <= version:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self._value

    async def wait_for(self, predicate: Callable[[T], R | None]) -> R:
        """Run ``predicate`` on the value now and after every change until it returns something
        other than None, and return that."""
        while True:
            version = self._version
            result = predicate(self._value)
            if result is not None:
                return result
            await self.newer_than(version)
