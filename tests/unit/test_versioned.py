"""devplug._versioned: the value every waiter of the library follows by version."""

from __future__ import annotations

import anyio
import pytest

from devplug._versioned import Versioned

pytestmark = pytest.mark.anyio


def test_built_and_set_outside_an_event_loop() -> None:
    box = Versioned("a")
    assert (box.value, box.version) == ("a", 0)
    box.set("b")
    box.bump()
    assert (box.value, box.version) == ("b", 2)


async def test_newer_than_returns_at_once_when_already_newer() -> None:
    box = Versioned(0)
    box.set(1)
    box.set(2)
    with anyio.fail_after(1):
        assert await box.newer_than(0) == 2  # the changes in between come as one
        assert await box.newer_than(1) == 2


async def test_a_change_between_two_waits_is_not_lost() -> None:
    box = Versioned(0)
    seen: list[int] = []
    took_one = anyio.Event()

    async def reader() -> None:
        version = 0
        while version < 3:
            value = await box.newer_than(version)
            version = box.version
            seen.append(value)
            took_one.set()
            await anyio.sleep(0.01)  # a change made now comes with the next wait

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.sleep(0.01)
            box.set(1)
            await took_one.wait()
            box.set(2)
            box.set(3)
    assert seen == [1, 3]


async def test_values_come_in_order_to_every_waiter() -> None:
    box = Versioned(0)
    got: dict[int, list[int]] = {}

    async def reader(n: int) -> None:
        got[n] = []
        version = 0
        while version < 5:
            got[n].append(await box.newer_than(version))
            version = box.version

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(reader, n)
            await anyio.sleep(0.01)
            for value in range(1, 6):
                box.set(value)
                await anyio.sleep(0.01)
    assert got == {n: [1, 2, 3, 4, 5] for n in range(4)}


async def test_wait_for_rechecks_after_every_change() -> None:
    box = Versioned([1])
    calls: list[list[int]] = []

    def enough(value: list[int]) -> int | None:
        calls.append(value)
        return sum(value) if len(value) >= 3 else None

    async with anyio.create_task_group() as tg:
        results: list[int] = []

        async def waiter() -> None:
            results.append(await box.wait_for(enough))

        tg.start_soon(waiter)
        await anyio.sleep(0.01)
        box.set([1, 2])
        await anyio.sleep(0.01)
        box.bump()  # the same value again: checked again
        await anyio.sleep(0.01)
        box.set([1, 2, 3])
    assert results == [6]
    assert calls == [[1], [1, 2], [1, 2], [1, 2, 3]]


async def test_wait_for_returns_a_false_result_that_is_not_none() -> None:
    box = Versioned(0)
    with anyio.fail_after(1):
        assert await box.wait_for(lambda value: value == 1) is False


async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    box = Versioned("start")
    woke: list[str] = []

    async def waiter(name: str) -> None:
        await box.newer_than(0)
        woke.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "kept")
        async with anyio.create_task_group() as doomed:
            doomed.start_soon(waiter, "cancelled")
            await anyio.sleep(0.01)
            doomed.cancel_scope.cancel()
        box.set("next")
    assert woke == ["kept"]


async def test_a_wait_with_a_timeout_then_a_change() -> None:
    box = Versioned(0)
    with anyio.move_on_after(0.01) as scope:
        await box.newer_than(0)
    assert scope.cancelled_caught
    box.set(1)
    with anyio.fail_after(1):
        assert await box.newer_than(0) == 1


async def test_waits_one_after_another() -> None:
    # The event is dropped when set: the next wait makes a fresh one.
    box = Versioned(0)
    for seen in range(3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_set_soon, box, seen + 1)
            with anyio.fail_after(1):
                assert await box.newer_than(seen) == seen + 1


async def _set_soon(box: Versioned[int], value: int) -> None:
    await anyio.sleep(0.01)
    box.set(value)
