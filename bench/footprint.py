"""Footprint of a plugin process: idle CPU and wake-ups, resident memory under Allocate load.

    python bench/footprint.py [--quick] [--out bench/results-footprint.json]

One ``devplug-fake`` process serving 3 resources of 100 devices (a scenario config file),
registered with a fake kubelet in this process that keeps its three ListAndWatch streams open.

- Idle: after a short settling time, CPU time (utime + stime of /proc/<pid>/stat) and
  wake-ups (the voluntary + non-voluntary context switches of every thread, from
  /proc/<pid>/task/*/status) are sampled once a second; each second is one run, and the
  wake-ups of each thread show where they come from. A bare grpc.aio server (bench/bare_plugin.py)
  with as many open client connections is sampled over the same seconds, for comparison.
- Memory: VmRSS (/proc/<pid>/status) idle, then after each checkpoint of Allocate calls
  (10,000 ... 100,000), spread over the three resources, one device per call. The client is
  grpc.aio in this process with many calls in flight, the fastest Python client measured here
  (a blocking client in a thread does about half as many calls a second).
Prints JSON.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import core
import grpc

from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.testing import FakeKubelet

RESOURCES = ("example.com/res-a", "example.com/res-b", "example.com/res-c")
DEVICES = 100
CHECKPOINTS = (10_000, 25_000, 50_000, 75_000, 100_000)


def scenario() -> str:
    lines = ["resources:"] + [f"  - {{name: {name}, count: {DEVICES}}}" for name in RESOURCES]
    return "\n".join(lines) + "\n"


def status_fields(path: Path, *names: str) -> dict[str, int]:
    """Integer fields of a /proc status file (the first number of each line)."""
    wanted = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key in names:
            wanted[key] = int(value.split()[0])
    return wanted


def rss_kib(pid: int) -> int:
    return status_fields(Path(f"/proc/{pid}/status"), "VmRSS")["VmRSS"]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def switches_by_thread(pid: int) -> dict[int, tuple[str, int]]:
    """tid → (thread name, voluntary + non-voluntary context switches so far)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = status_fields(task / "status", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
            name = (task / "comm").read_text().strip()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        threads[int(task.name)] = (name, sum(fields.values()))
    return threads


def wakeups_between(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[int, int]:
    """Context switches per thread between two readings (a thread born in between counts in full)."""
    return {tid: count - (before[tid][1] if tid in before else 0) for tid, (_, count) in after.items()}


def _per_second(samples: list[float], unit: str) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "unit": unit,
        "runs": len(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max": ordered[-1],
        "mean": round(sum(ordered) / len(ordered), 2),
    }


async def measure_idle(pids: dict[str, int], seconds: int) -> dict[str, dict[str, Any]]:
    """Sample CPU time and wake-ups of each process once a second for ``seconds`` seconds, together."""
    tick = os.sysconf("SC_CLK_TCK")
    start_threads = {name: switches_by_thread(pid) for name, pid in pids.items()}
    start_cpu = {name: cpu_ticks(pid) for name, pid in pids.items()}
    threads, cpu = dict(start_threads), dict(start_cpu)
    wakeups: dict[str, list[float]] = {name: [] for name in pids}
    cpu_ms: dict[str, list[float]] = {name: [] for name in pids}
    began = next_at = time.monotonic()
    for _ in range(seconds):
        next_at += 1.0
        await anyio.sleep(next_at - time.monotonic())
        for name, pid in pids.items():
            now_threads, now_cpu = switches_by_thread(pid), cpu_ticks(pid)
            wakeups[name].append(float(sum(wakeups_between(threads[name], now_threads).values())))
            cpu_ms[name].append((now_cpu - cpu[name]) * 1000 / tick)
            threads[name], cpu[name] = now_threads, now_cpu
    elapsed = time.monotonic() - began
    results = {}
    for name in pids:
        per_thread = [
            {"thread": threads[name][tid][0], "tid": tid, "per_second": round(count / elapsed, 2)}
            for tid, count in wakeups_between(start_threads[name], threads[name]).items()
        ]
        per_thread.sort(key=lambda t: -t["per_second"])
        results[name] = {
            "seconds": round(elapsed, 2),
            "threads": len(threads[name]),
            "threads_ended_meanwhile": len(set(start_threads[name]) - set(threads[name])),
            "wakeups_per_second": _per_second(wakeups[name], "per s"),
            "busiest_thread_wakeups_per_second": per_thread[0]["per_second"],
            "cpu_ms_per_second": _per_second(cpu_ms[name], "ms CPU per s"),
            "cpu_percent": round((cpu[name] - start_cpu[name]) / tick / elapsed * 100, 3),
            "wakeups_by_thread": per_thread,
        }
    return results


async def allocate_load(
    sockets: list[Path], pid: int, checkpoints: tuple[int, ...], concurrency: int
) -> dict[str, Any]:
    """Allocate calls up to each checkpoint, VmRSS after each; the calls cycle over resources and devices."""
    requests = [
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"fake-{i}"])])
        for i in range(DEVICES)
    ]
    channels = [grpc.aio.insecure_channel(f"unix:{path}") for path in sockets]
    stubs: list[Any] = [pb_grpc.DevicePluginStub(channel) for channel in channels]
    done = 0
    rss: dict[str, int] = {}
    began = time.monotonic()
    cpu_before = cpu_ticks(pid)
    try:
        for target in checkpoints:
            calls = iter(range(done, target))

            async def worker(calls: Any = calls) -> None:
                for i in calls:
                    response = await stubs[i % len(stubs)].Allocate(requests[i % DEVICES])
                    assert len(response.container_responses) == 1

            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(worker)
            done = target
            rss[str(target)] = rss_kib(pid)
    finally:
        for channel in channels:
            await channel.close()
    seconds = time.monotonic() - began
    return {
        "calls": done,
        "concurrency": concurrency,
        "seconds": round(seconds, 2),
        "calls_per_second": round(done / seconds),
        "plugin_cpu_percent": round((cpu_ticks(pid) - cpu_before) / os.sysconf("SC_CLK_TCK") / seconds * 100),
        "vmrss_kib_after_calls": rss,
    }


async def bench_footprint(
    workdir: Path,
    *,
    idle_seconds: int = 10,
    settle: float = 2.0,
    checkpoints: tuple[int, ...] = CHECKPOINTS,
    concurrency: int = 32,
) -> dict[str, Any]:
    dp_dir = workdir / "footprint"
    config = workdir / "footprint.yaml"
    config.write_text(scenario())
    async with (
        FakeKubelet(dp_dir) as kubelet,
        core.started(core.plugin_command(dp_dir, "--config", str(config))) as process,
    ):
        sockets = []
        for name in RESOURCES:
            registration = await kubelet.wait_for_registration(name, timeout=30)
            await kubelet.wait_for_devices(name, lambda ds: len(ds) == DEVICES, timeout=30)
            sockets.append(dp_dir / registration.endpoint)
        bare_socket = workdir / "bare-idle.sock"
        bare_command = [sys.executable, str(core.ROOT / "bench" / "bare_plugin.py"), str(bare_socket)]
        async with core.started(bare_command) as bare:
            # As many open connections as the plugin has streams: open connections wake grpc too.
            with anyio.fail_after(30):
                while not bare_socket.exists():  # noqa: ASYNC110 - another process creates it
                    await anyio.sleep(0.01)
            own_connection = [("grpc.use_local_subchannel_pool", 1)]
            channels = [
                grpc.aio.insecure_channel(f"unix:{bare_socket}", options=own_connection) for _ in RESOURCES
            ]
            try:
                for channel in channels:
                    stub: Any = pb_grpc.DevicePluginStub(channel)
                    await stub.Allocate(
                        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest()])
                    )
                await anyio.sleep(settle)
                idle = await measure_idle({"devplug": process.pid, "bare_grpc_aio": bare.pid}, idle_seconds)
            finally:
                for channel in channels:
                    await channel.close()
        idle_rss = rss_kib(process.pid)
        load = await allocate_load(sockets, process.pid, checkpoints, concurrency)
        assert process.returncode is None, "the plugin exited under load"
        hwm = status_fields(Path(f"/proc/{process.pid}/status"), "VmHWM")["VmHWM"]
    after = load["vmrss_kib_after_calls"]
    first, last = str(checkpoints[0]), str(checkpoints[-1])
    return {
        "plugin": f"devplug-fake, {len(RESOURCES)} resources of {DEVICES} devices",
        "idle": idle["devplug"],
        "idle_bare_grpc_aio": idle["bare_grpc_aio"],
        "memory": {
            "vmrss_kib_idle": idle_rss,
            **load,
            "vmhwm_kib": hwm,
            "growth_kib": {f"{first}_to_{last}": after[last] - after[first]},
        },
    }


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        figures = await bench_footprint(
            workdir,
            idle_seconds=3 if quick else 10,
            settle=1.0 if quick else 2.0,
            checkpoints=(2_000, 10_000) if quick else CHECKPOINTS,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"machine": core.machine_info(), **figures}


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
