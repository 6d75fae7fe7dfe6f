"""Two copies of a device plugin on one resource, as real processes: when the copy the kubelet
took the resource over to stops, the other one registers again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devplug.testing import FakeKubelet
from tests.support import logged_process, wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/fake"


async def test_the_remaining_copy_registers_again(short_dir: Path) -> None:
    dp = short_dir / "dp"
    first_log, second_log = short_dir / "first.log", short_dir / "second.log"

    def accepted() -> list[str]:
        return [r.endpoint for r in kubelet.registrations if r.accepted and r.resource == RESOURCE]

    async with FakeKubelet(dp) as kubelet:
        async with logged_process("devplug_fake", ["--device-plugin-dir", str(dp)], first_log):
            await wait_until(lambda: len(accepted()) == 1, timeout=30, what="the first copy registered")
            async with logged_process("devplug_fake", ["--device-plugin-dir", str(dp)], second_log):
                await wait_until(lambda: len(accepted()) == 2, timeout=30, what="the second copy registered")
            # logged_process stopped the second copy with SIGTERM (status 0).
            await wait_until(lambda: len(accepted()) == 3, timeout=30, what="the first copy registered again")
            first, _, again = accepted()
            assert again != first
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4 and all(d.healthy for d in ds))
            assert kubelet.resource(RESOURCE).endpoint == str(dp / again)
        records = [json.loads(line) for line in first_log.read_text().splitlines()]
        registered = [r for r in records if r["event"] == "registered"]
        assert [r["reason"] for r in registered] == ["start", "rival_stopped"]
