"""Core runtime benchmarks, measured from the kubelet's side of the socket.

    python bench/core.py [--quick] [--out bench/results-core.json]

The kubelet side (devplug.testing.FakeKubelet and a raw gRPC client) runs in this process; the
plugin is a separate ``devplug-fake`` process, as on a node. For the Allocate round trip the
same client also calls a bare grpc.aio server answering the same response (bench/bare_plugin.py)
so the framework's cost can be read off against the floor. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import grpc

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.logging import configure as configure_logging
from devplug.testing import FakeKubelet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

ROOT = Path(__file__).resolve().parent.parent
RESOURCE = "example.com/fake"


def summary(samples_s: list[float], unit: str = "ms") -> dict[str, Any]:
    scale = {"ms": 1e3, "us": 1e6}[unit]
    ordered = sorted(samples_s)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * scale, 3)

    return {
        "unit": unit,
        "runs": len(ordered),
        "p50": pct(50),
        "p99": pct(99),
        "max": round(ordered[-1] * scale, 3),
        "mean": round(statistics.fmean(ordered) * scale, 3),
    }


def machine_info() -> dict[str, Any]:
    """What every result is printed with: core count, Python and grpcio versions, platform."""
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
    }


def plugin_command(dp_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "devplug_fake",
        "--device-plugin-dir",
        str(dp_dir),
        "--log-level",
        "warning",
        *extra,
    ]


@asynccontextmanager
async def started(
    command: list[str], env: Mapping[str, str] | None = None
) -> AsyncIterator[anyio.abc.Process]:
    """A process that is stopped with SIGTERM at the end (and killed if it lingers or on errors)."""
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, env=env)
    try:
        yield process
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with anyio.move_on_after(5):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def bench_start(workdir: Path, runs: int) -> dict[str, Any]:
    to_register, to_list = [], []
    for i in range(runs):
        dp_dir = workdir / f"start-{i}"
        async with FakeKubelet(dp_dir) as kubelet:
            began = time.monotonic()
            async with started(plugin_command(dp_dir)):
                reg = await kubelet.wait_for_registration(RESOURCE, timeout=30)
                await kubelet.wait_for_devices(RESOURCE, timeout=30)
                to_list.append(time.monotonic() - began)
                to_register.append(reg.at - began)
    return {"start_to_register": summary(to_register), "start_to_first_list": summary(to_list)}


async def bench_restarts_and_health(workdir: Path, restarts: int, flips: int) -> dict[str, Any]:
    dp_dir = workdir / "restarts"
    state = workdir / "state.json"

    def write_state(unhealthy: bool) -> None:
        devices = [
            {"id": f"fake-{i}", "health": "Unhealthy" if unhealthy and i == 0 else "Healthy"}
            for i in range(8)
        ]
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"devices": devices}))
        os.replace(tmp, state)

    write_state(False)
    async with FakeKubelet(dp_dir) as kubelet, started(plugin_command(dp_dir, "--state-file", str(state))):
        await kubelet.wait_for_registration(RESOURCE, timeout=30)
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8, timeout=30)
        to_register, to_list = [], []
        for i in range(restarts):
            before = time.monotonic()
            await kubelet.restart()
            reg = await kubelet.wait_for_registration(RESOURCE, count=i + 2)
            await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
            to_list.append(time.monotonic() - before)
            to_register.append(reg.at - before)
        health = []
        for i in range(flips):
            unhealthy = i % 2 == 0
            before = time.monotonic()
            write_state(unhealthy)
            await kubelet.wait_for_devices(RESOURCE, lambda ds, u=unhealthy: ds[0].healthy is not u)
            health.append(time.monotonic() - before)
    return {
        "kubelet_restart_to_register": summary(to_register),
        "kubelet_restart_to_first_list": summary(to_list),
        "health_change_to_kubelet": summary(health),
    }


BLOCK = 50  # calls to one server before the client turns to the other


def round_trips(sockets: dict[str, Path], calls: int) -> dict[str, Any]:
    """Allocate and GetPreferredAllocation round trips from a blocking client in a thread.

    The same client calls every server of ``sockets`` (name → socket) in turn, ``BLOCK`` calls
    at a time, the order swapped each block: a change in the machine's load (other processes
    on 2 shared cores) falls on all of them alike, so their difference is devplug's cost. A Go
    client (the kubelet's) spends less per call than this one.
    """
    results: dict[str, Any] = {name: {} for name in sockets}
    channels = {name: grpc.insecure_channel(f"unix://{path}") for name, path in sockets.items()}
    try:
        stubs: dict[str, Any] = {name: pb_grpc.DevicePluginStub(ch) for name, ch in channels.items()}
        ids = [f"fake-{i}" for i in range(8)]
        for n in (1, 8):
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:n])]
            )
            preferred = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=n)
                ]
            )
            for name, method, message in (
                ("allocate", "Allocate", request),
                ("preferred", "GetPreferredAllocation", preferred),
            ):
                calls_of = {target: getattr(stub, method) for target, stub in stubs.items()}
                for call in calls_of.values():
                    for _ in range(200):  # warm-up
                        call(message)
                samples: dict[str, list[float]] = {target: [] for target in calls_of}
                order = list(calls_of)
                for block in range(max(1, calls // BLOCK)):
                    for target in order if block % 2 == 0 else reversed(order):
                        call, times = calls_of[target], samples[target]
                        for _ in range(BLOCK):
                            before = time.perf_counter()
                            call(message)
                            times.append(time.perf_counter() - before)
                key = f"{name}_{n}_device{'s' if n > 1 else ''}"
                for target, times in samples.items():
                    results[target][key] = summary(times, "us")
    finally:
        for channel in channels.values():
            channel.close()
    return results


async def bench_round_trips(workdir: Path, calls: int) -> dict[str, Any]:
    """devplug-fake and the bare grpc.aio plugin, both serving, called in alternating blocks."""
    dp_dir = workdir / "rtt"
    bare_socket = workdir / "bare.sock"
    bare = [sys.executable, str(ROOT / "bench" / "bare_plugin.py"), str(bare_socket)]
    async with (
        FakeKubelet(dp_dir) as kubelet,
        started(plugin_command(dp_dir, "--count", "8")),
        started(bare),
    ):
        reg = await kubelet.wait_for_registration(RESOURCE, timeout=30)
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        with anyio.fail_after(30):
            while not bare_socket.exists():  # noqa: ASYNC110 - another process creates it
                await anyio.sleep(0.01)
        sockets = {"devplug": dp_dir / reg.endpoint, "bare_grpc_aio": bare_socket}
        return await anyio.to_thread.run_sync(round_trips, sockets, calls)


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        results: dict[str, Any] = {"machine": machine_info()}
        results.update(await bench_start(workdir, 5 if quick else 20))
        results.update(await bench_restarts_and_health(workdir, 20 if quick else 200, 50 if quick else 500))
        results["round_trip"] = await bench_round_trips(workdir, 300 if quick else 3000)
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def cli(doc: str | None, run: Callable[[bool], Awaitable[dict[str, Any]]]) -> None:
    """The command line every bench script shares: ``[--quick] [--out FILE]``, JSON on stdout."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs (a smoke test of the benchmark)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    configure_logging("console", "warning")  # the fake kubelet's info logs would drown the JSON
    results = anyio.run(run, args.quick, backend="asyncio")
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def main() -> None:
    cli(__doc__, main_async)


if __name__ == "__main__":
    main()
