"""/healthz, /readyz and /debug/state of real processes, and SIGUSR1's dump to the log."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import anyio
import pytest

from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.metrics.probing import events, free_port, get, plugin, wait_for_event, wait_for_port
from tests.support import wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/fake"


async def test_readiness_follows_registration_and_kubelet_restarts(short_dir: Path) -> None:
    dp, log = short_dir / "dp", short_dir / "log"
    port = free_port()
    args = ("--device-plugin-dir", str(dp), "--count", "2", "--metrics-address", f"127.0.0.1:{port}")
    async with plugin(log, "devplug_fake", *args) as process:
        await wait_for_port(port, process, log)
        # No kubelet yet (nor its directory): alive, not ready, and the body says why.
        status, _, body = await get(port, "/healthz")
        assert (status, body) == (200, b"ok\n")
        status, _, body = await get(port, "/readyz")
        assert status == 503
        missing = f"{dp} does not exist (the kubelet creates it)"
        assert body.decode() == f"not ready:\n- {missing}\n- {RESOURCE}: not registered\n"

        async with FakeKubelet(dp) as kubelet:
            await kubelet.wait_for_devices(RESOURCE, timeout=10)

            async def ready() -> bool:
                return (await get(port, "/readyz"))[0] == 200

            await wait_until(ready, timeout=10, interval=0.05)
            assert (await get(port, "/readyz"))[2] == b"ready\n"

            # While the kubelet is down (its restart takes a second here): not ready.
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: kubelet.restart(downtime=1.0))

                async def not_ready() -> bytes | None:
                    status, _, body = await get(port, "/readyz")
                    return body if status == 503 else None

                assert b"example.com/fake: " in await wait_until(not_ready, timeout=10, interval=0.05)
            await kubelet.wait_for_registration(RESOURCE, count=2, timeout=10)
            await wait_until(ready, timeout=10, interval=0.05)

            status, headers, body = await get(port, "/debug/state")
            assert status == 200
            assert headers["content-type"] == "application/json"
            state = json.loads(body)
            assert state["ready"] is True
            assert state["not_ready"] == []
            resource = state["resources"][RESOURCE]
            assert resource["registered"] is True
            assert resource["socket"] == kubelet.resource(RESOURCE).endpoint.rsplit("/", 1)[-1]
            assert resource["last_sent"]["version"] == resource["current_version"] == 1
            assert [(d["id"], d["health"]) for d in resource["last_sent"]["devices"]] == [
                ("fake-0", "Healthy"),
                ("fake-1", "Healthy"),
            ]
            assert resource["registrations"][0]["reason"] == "start"
            assert len(resource["registrations"]) == 2
            assert [e["event"] for e in state["events"]] == ["resource_added"]

            # SIGUSR1: the same state, in the log.
            signal_child(process, signal.SIGUSR1)
            dumped = (await wait_for_event(log, "debug_state"))[0]
            assert dumped["resources"][RESOURCE]["registered"] is True

            assert (await get(port, "/nope"))[0] == 404
    assert events(log, "metrics_serving")[0]["address"] == f"127.0.0.1:{port}"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a real NVIDIA driver is present here")
async def test_nvidia_idle_after_init_failure_is_not_ready_with_the_reason(short_dir: Path) -> None:
    dp, log = short_dir / "dp", short_dir / "log"
    port = free_port()
    args = (
        "--fail-on-init-error=false",
        "--device-plugin-dir",
        str(dp),
        "--metrics-address",
        f"127.0.0.1:{port}",
    )
    async with FakeKubelet(dp), plugin(log, "devplug_nvidia", *args) as process:
        await wait_for_port(port, process, log)
        status, _, body = await get(port, "/readyz")
        assert (await get(port, "/healthz"))[0] == 200
    assert status == 503
    text = body.decode()
    assert text.startswith("not ready:\n- device discovery failed: ")
    assert "libnvidia-ml.so.1" in text  # STATUS.reason: what to check
    assert events(log, "init_failed_idle")[0]["reason"] in text
