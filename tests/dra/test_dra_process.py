"""devplug-fake --api dra as a real process: probes, metrics, a claim, SIGTERM at any moment."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devplug.testing import FakeKubeAPI
from devplug.testing._process import signal_child
from tests.dra.dra_kit import NODE, notify, prepare, unprepare
from tests.metrics.probing import free_port, get, plugin
from tests.support import wait_until

pytestmark = pytest.mark.anyio

DRIVER = "fake.example.com"


def args(root: Path, kubeconfig: Path, *extra: str) -> list[str]:
    """The driver's options, its kubelet root ``root/k``; plugins_registry in it is made first,
    as the kubelet's plugin watcher makes it (the driver waits for it, never creates it)."""
    (root / "k" / "plugins_registry").mkdir(parents=True, exist_ok=True)
    return [
        "--api", "dra", "--driver-name", DRIVER, "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--kubelet-root", str(root / "k"),
        "--cdi-dir", str(root / "cdi"), "--count", "4", *extra,
    ]  # fmt: skip


async def test_probes_metrics_and_a_claim(short_dir: Path) -> None:
    port = free_port()
    dra_socket = short_dir / "k" / "plugins" / DRIVER / "dra.sock"
    registration = short_dir / "k" / "plugins_registry" / f"{DRIVER}-reg.sock"
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(short_dir / "kc")
        log = short_dir / "driver.log"
        async with plugin(
            log, "devplug_fake", *args(short_dir, kubeconfig, "--metrics-address", f"127.0.0.1:{port}")
        ):
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=30)
            status, _, body = await get(port, "/readyz")
            assert status == 503
            assert b"not registered" in body
            await notify(registration)

            async def ready() -> bool:
                return (await get(port, "/readyz"))[0] == 200

            await wait_until(ready, interval=0.05, what="/readyz to answer 200")
            api.add_claim("ns", "c", requests=[("fake", 2)])
            uid = api.allocate_claim("ns", "c", node=NODE, driver=DRIVER, count=2)["metadata"]["uid"]
            assert (await prepare(dra_socket, ("ns", "c", uid)))[uid].error == ""
            assert (await prepare(dra_socket, ("ns", "missing", "u-2")))["u-2"].error
            assert (await unprepare(dra_socket, ("ns", "c", uid)))[uid].error == ""
            _, _, text = await get(port, "/metrics")
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text.decode())
                for s in family.samples
            }
            method = (("driver", DRIVER), ("method", "NodePrepareResources"))
            assert samples[("devplug_dra_requests_total", method)] == 2
            assert samples[("devplug_dra_claim_errors_total", method)] == 1
            assert samples[("devplug_dra_resourceslices", (("driver", DRIVER),))] == 1
            assert samples[("devplug_dra_devices", (("driver", DRIVER), ("health", "Healthy")))] == 4
            assert samples[("devplug_dra_registration", (("driver", DRIVER),))] == 1
            assert samples[("devplug_ready", ())] == 1
            state = json.loads((await get(port, "/debug/state"))[2])
            assert state["api"] == "dra"
            assert state["slices"]["in_sync"] is True
            api.wipe_slices(NODE)  # a kubelet start
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=5)
        # plugin() sent SIGTERM and checked the exit status 0; the sockets must be gone.
        assert not dra_socket.exists()
        assert not registration.exists()


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3, 0.6, 0.8, 1.0])
async def test_sigterm_at_any_moment_exits_0_and_leaves_no_socket(short_dir: Path, delay: float) -> None:
    import sys

    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(short_dir / "kc")
        process = await anyio.open_process(
            [sys.executable, "-m", "devplug_fake", *args(short_dir, kubeconfig), "--log-format", "json"]
        )
        async with process:
            await anyio.sleep(delay)
            signal_child(process, signal.SIGTERM)
            started = time.monotonic()
            with anyio.fail_after(5):
                code = await process.wait()
        # 130: stopped before serving started ("interrupted"); -SIGTERM: before main's first
        # line installed the handler, the default action.
        assert code in (0, 130, -signal.SIGTERM)
        assert time.monotonic() - started < 2
        leftovers = [p.name for p in (short_dir / "k").rglob("*.sock")] if (short_dir / "k").exists() else []
        assert leftovers == []


async def test_devplug_run_serves_any_plugin_class_as_a_driver(short_dir: Path) -> None:
    """``devplug run --api dra MODULE:CLASS``: options before or after the target alike."""
    import os
    import subprocess
    import sys

    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(short_dir / "kc")
        argv = [
            sys.executable, "-m", "devplug", "run", "--api", "dra", "tests.support:Widgets",
            "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--kubelet-root", str(short_dir / "k"),
            "--cdi-dir", str(short_dir / "cdi"), "--log-format", "json",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        async with await anyio.open_process(argv, stdout=subprocess.DEVNULL, env=env) as process:
            slices = await api.wait_for_slices(node=NODE, driver="widget.example.com", count=1, timeout=30)
            assert sorted(d["name"] for d in slices[0]["spec"]["devices"]) == ["w0", "w1", "w2", "w3"]
            signal_child(process, signal.SIGTERM)
            with anyio.fail_after(5):
                assert await process.wait() == 0
        assert not (short_dir / "k" / "plugins" / "widget.example.com" / "dra.sock").exists()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_signal_during_shutdown_changes_nothing(
    short_dir: Path, second: signal.Signals
) -> None:
    """SIGTERM, then SIGTERM or Ctrl-C 2 ms later: exit 0, no traceback, no socket left."""
    import subprocess
    import sys

    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(short_dir / "kc")
        argv = [sys.executable, "-m", "devplug_fake", *args(short_dir, kubeconfig), "--log-format", "json"]
        async with await anyio.open_process(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        ) as process:
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=30)
            signal_child(process, signal.SIGTERM)
            await anyio.sleep(0.002)
            signal_child(process, second)
            with anyio.fail_after(5):
                code = await process.wait()
            assert process.stderr is not None
            err = b"".join([chunk async for chunk in process.stderr]).decode()
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
    assert not list((short_dir / "k").rglob("*.sock"))
