from __future__ import annotations

import anyio
import pytest

from devplug import Device, Health
from devplug._runtime.state import DeviceState

pytestmark = pytest.mark.anyio


async def test_versions_and_unchanged_lists() -> None:
    state = DeviceState()
    assert state.current.version == 0
    assert state.publish([Device(id="a")])
    assert not state.publish([Device(id="a")])  # same set: no new version, no message
    assert state.publish([Device(id="a", health=Health.UNHEALTHY)])
    assert state.current.version == 2
    assert state.current.by_id["a"].health is Health.UNHEALTHY


async def test_duplicate_ids_rejected_and_state_kept() -> None:
    state = DeviceState()
    state.publish([Device(id="a")])
    with pytest.raises(ValueError, match="duplicate device IDs: b"):
        state.publish([Device(id="b"), Device(id="a"), Device(id="b")])
    assert state.current.version == 1


async def test_each_reader_has_its_own_cursor_and_bursts_coalesce() -> None:
    state = DeviceState()
    seen: dict[str, list[int]] = {"fast": [], "slow": []}

    async def reader(name: str, delay: float, until: int) -> None:
        version = 0
        while version < until:
            snap = await state.newer_than(version)
            version = snap.version
            seen[name].append(version)
            await anyio.sleep(delay)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader, "fast", 0, 5)
        tg.start_soon(reader, "slow", 0.2, 5)
        for i in range(5):
            await anyio.sleep(0.02)
            state.publish([Device(id=f"d{i}")])
    assert seen["fast"] == [1, 2, 3, 4, 5]
    assert seen["slow"][0] == 1 and seen["slow"][-1] == 5 and len(seen["slow"]) < 5
