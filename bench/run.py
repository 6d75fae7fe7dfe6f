"""Every benchmark in one run: writes bench/results.json and the table in docs/benchmarks.md.

    python bench/run.py            # the full run (about 3 minutes on 2 cores)
    python bench/run.py --quick    # a smoke test: fewer runs; prints the table, writes nothing
    python bench/run.py --only nvidia_dra   # one section again, into the last full run's results
    python bench/run.py --only dra_shares   # DRA prepare of shared devices beside an exclusive one
    python bench/run.py --only real_api     # devplug beside the Go anchors on a real API server

Measured from the kubelet's side of the socket: a fake kubelet (devplug.testing.FakeKubelet)
and raw gRPC clients run in this process, each plugin is a separate ``devplug-fake`` process.
For DRA, the API server (devplug.testing.FakeKubeAPI) and the kubelet's gRPC clients run in
this process, the driver is a separate ``devplug-fake --api dra`` process.
The pieces run on their own too: bench/core.py, bench/scale.py, bench/footprint.py,
bench/policies.py, bench/dra.py, bench/dra_shares.py and bench/nvidia_dra.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import core
import dra
import dra_shares
import footprint
import nvidia_dra
import policies
import real_api
import scale
import startup

from devplug.logging import configure as configure_logging

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

ROOT = core.ROOT
RESULTS = ROOT / "bench" / "results.json"
DOC = ROOT / "docs" / "benchmarks.md"
MIB = 1024

# Run counts: (full, quick).
COUNTS: dict[str, tuple[Any, Any]] = {
    "starts": (20, 5),
    "restarts": (100, 20),
    "health_flips": (300, 50),
    "round_trip_calls": (2000, 300),
    "state_file_lists": ({10_000: 5, 50_000: 3}, {10_000: 2, 50_000: 1}),
    "generated_lists": ({10_000: 3, 50_000: 3}, {10_000: 1, 50_000: 1}),
    "idle_seconds": (10, 3),
    "allocate_checkpoints": (footprint.CHECKPOINTS, (2_000, 10_000)),
    "policy_instances": (30, 5),
    "dra_prepare_calls": (300, 60),
    "dra_piece_calls": (100, 30),
    "dra_publications": ({1000: 5, 10_000: 3}, {1000: 1, 10_000: 1}),
    "dra_wipes": (25, 5),
    "dra_health_flips": (150, 30),
    "dra_breakdown_runs": (200, 50),
    "dra_share_calls": (300, 60),
    "dra_share_breakdown_runs": (200, 50),
    "nvidia_dra_calls": (200, 40),
    "nvidia_dra_breakdown_runs": (100, 20),
    "startup_rounds": (startup.RUNS[False], startup.RUNS[True]),
    "import_runs": (startup.IMPORT_RUNS[False], startup.IMPORT_RUNS[True]),
}
ONLY = ("nvidia_dra", "dra_shares", "startup", "round_trip", "real_api")
"""Sections ``--only`` runs by themselves, replacing their figures in the last full run's results."""


async def run_nvidia_dra(workdir: Path, quick: bool) -> dict[str, Any]:
    """devplug-nvidia's DRA prepare beside devplug-fake's (bench/nvidia_dra.py)."""

    def n(name: str) -> Any:
        return COUNTS[name][1 if quick else 0]

    figures: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "prepare": await nvidia_dra.bench(workdir, n("nvidia_dra_calls")),
    }
    figures["breakdown"] = await anyio.to_thread.run_sync(
        nvidia_dra.breakdown, workdir, n("nvidia_dra_breakdown_runs")
    )
    return figures


async def run_dra_shares(workdir: Path, quick: bool) -> dict[str, Any]:
    """DRA prepare of shared devices beside an exclusive one (bench/dra_shares.py)."""

    def n(name: str) -> Any:
        return COUNTS[name][1 if quick else 0]

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        **await dra_shares.bench(workdir, n("dra_share_calls"), n("dra_share_breakdown_runs")),
    }


async def run_startup(workdir: Path, quick: bool) -> dict[str, Any]:
    """Start → Register of devplug's commands beside the bare plugin, and import times (bench/startup.py)."""

    def n(name: str) -> Any:
        return COUNTS[name][1 if quick else 0]

    await anyio.to_thread.run_sync(startup.byte_compile)
    figures: dict[str, Any] = await startup.bench_startup(workdir, n("startup_rounds"))
    figures["imports"] = await anyio.to_thread.run_sync(startup.import_times, n("import_runs"))
    return figures


async def run_all(quick: bool) -> dict[str, Any]:
    def n(name: str) -> Any:
        return COUNTS[name][1 if quick else 0]

    results: dict[str, Any] = {
        "machine": core.machine_info(),
        "quick": quick,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": {},
    }
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))

    async def section(name: str, work: Callable[[], Awaitable[Any]]) -> Any:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        began = time.monotonic()
        value = await work()
        results["seconds"][name] = round(time.monotonic() - began, 1)
        return value

    async def policy_timings() -> Any:
        return [policies.bench(devices, n("policy_instances"), seed=1) for devices in (8, 16)]

    async def sizes() -> Any:
        return {"limit_bytes": scale.MAX_MESSAGE_BYTES, "shapes": scale.largest_counts()}

    async def breakdown() -> Any:
        return scale.breakdown()

    try:
        results["start"] = await section("start", lambda: core.bench_start(workdir, n("starts")))
        results["startup"] = await section("startup", lambda: run_startup(workdir, quick))
        results["restart_and_health"] = await section(
            "restart_and_health",
            lambda: core.bench_restarts_and_health(workdir, n("restarts"), n("health_flips")),
        )
        results["round_trip"] = await section(
            "round_trip", lambda: core.bench_round_trips(workdir, n("round_trip_calls"))
        )
        results["large_lists"] = await section(
            "large_lists", lambda: scale.bench_large_lists(workdir, n("state_file_lists"))
        )
        results["generated_lists"] = await section(
            "generated_lists", lambda: scale.bench_generated_lists(workdir, n("generated_lists"))
        )
        results["state_file_breakdown"] = await section("state_file_breakdown", breakdown)
        results["largest_under_limit"] = await section("largest_under_limit", sizes)
        results["footprint"] = await section(
            "footprint",
            lambda: footprint.bench_footprint(
                workdir,
                idle_seconds=n("idle_seconds"),
                settle=1.0 if quick else 2.0,
                checkpoints=n("allocate_checkpoints"),
            ),
        )
        results["topology_score"] = await section("topology_score", policy_timings)
        results["dra"] = {"lightkube": dra.machine_info()["lightkube"]}
        results["dra"]["prepare"] = await section(
            "dra_prepare",
            lambda: dra.bench_prepare(workdir, n("dra_prepare_calls"), n("dra_piece_calls")),
        )
        results["dra"]["publication"] = await section(
            "dra_publication", lambda: dra.bench_publication(workdir, n("dra_publications"))
        )
        results["dra"]["wipes"] = await section("dra_wipes", lambda: dra.bench_wipes(workdir, n("dra_wipes")))
        results["dra"]["health"] = await section(
            "dra_health", lambda: dra.bench_health(workdir, n("dra_health_flips"))
        )
        results["dra"]["breakdown"] = await section(
            "dra_breakdown", lambda: dra.breakdown(workdir, n("dra_breakdown_runs"))
        )
        results["dra_shares"] = await section("dra_shares", lambda: run_dra_shares(workdir, quick))
        results["nvidia_dra"] = await section("nvidia_dra", lambda: run_nvidia_dra(workdir, quick))
        results["real_api"] = await section("real_api", lambda: real_api.bench(workdir, quick))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["seconds"]["total"] = round(sum(results["seconds"].values()), 1)
    return results


async def run_section(name: str, quick: bool) -> Any:
    """One of :data:`ONLY` by itself."""
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        if name == "nvidia_dra":
            return await run_nvidia_dra(workdir, quick)
        if name == "dra_shares":
            return await run_dra_shares(workdir, quick)
        if name == "startup":
            return await run_startup(workdir, quick)
        if name == "round_trip":
            return await core.bench_round_trips(workdir, COUNTS["round_trip_calls"][1 if quick else 0])
        if name == "real_api":
            return await real_api.bench(workdir, quick)
        raise ValueError(f"no section {name}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- the Markdown page ---------------------------------------------------------------------------


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(summary: dict[str, Any], key: str) -> str:
    unit = {"us": "µs", "per s": "/s", "ms CPU per s": "ms/s"}.get(summary["unit"], summary["unit"])
    return f"{_fmt(summary[key])} {unit}"


def _verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "**no**")


def render(results: dict[str, Any]) -> tuple[str, list[str]]:
    """The Markdown page, and the IDs of the figures that miss their targets."""
    misses: list[str] = []
    timing_rows: list[str] = []
    value_rows: list[str] = []

    def timing(key: str, label: str, summary: dict[str, Any], target: str, ok: bool | None) -> None:
        if ok is False:
            misses.append(key)
        cells = " | ".join(_cell(summary, k) for k in ("p50", "p99", "max"))
        timing_rows.append(f"| {label} | {cells} | {summary['runs']} | {target} | {_verdict(ok)} |")

    def value(key: str, label: str, text: str, runs: int, target: str, ok: bool | None) -> None:  # noqa: PLR0917
        if ok is False:
            misses.append(key)
        value_rows.append(f"| {label} | {text} | {runs} | {target} | {_verdict(ok)} |")

    start, restart = results["start"], results["restart_and_health"]
    timing(
        "start_register",
        "process start → Register received",
        start["start_to_register"],
        "p99 ≤ 500 ms",
        start["start_to_register"]["p99"] <= 500,
    )
    timing(
        "start_list",
        "process start → first device list",
        start["start_to_first_list"],
        "p99 ≤ 600 ms",
        start["start_to_first_list"]["p99"] <= 600,
    )
    timing(
        "restart_register",
        "kubelet restart → Register received",
        restart["kubelet_restart_to_register"],
        "p99 ≤ 50 ms",
        restart["kubelet_restart_to_register"]["p99"] <= 50,
    )
    timing(
        "restart_list",
        "kubelet restart → first device list",
        restart["kubelet_restart_to_first_list"],
        "p99 ≤ 100 ms",
        restart["kubelet_restart_to_first_list"]["p99"] <= 100,
    )
    timing(
        "health",
        "health change (state file) → kubelet's stream",
        restart["health_change_to_kubelet"],
        "p99 ≤ 5 ms",
        restart["health_change_to_kubelet"]["p99"] <= 5,
    )
    trips = results["round_trip"]
    for name, label in (
        ("allocate_1_device", "Allocate, 1 device"),
        ("allocate_8_devices", "Allocate, 8 devices"),
        ("preferred_1_device", "GetPreferredAllocation, 1 device"),
        ("preferred_8_devices", "GetPreferredAllocation, 8 devices"),
    ):
        mine, bare = trips["devplug"][name], trips["bare_grpc_aio"][name]
        over = (mine["p50"] / bare["p50"] - 1) * 100
        timing(
            f"rtt_{name}",
            f"{label}: devplug",
            mine,
            "p50 ≤ 300 µs, p99 ≤ 1 ms",
            mine["p50"] <= 300 and mine["p99"] <= 1000,
        )
        timing(
            f"rtt_rel_{name}",
            f"{label}: bare grpc.aio (the floor); devplug p50 {over:+.0f} %",
            bare,
            "devplug p50 ≤ floor + 10 %",
            over <= 10,
        )
    for key, figures in results["large_lists"].items():
        count = figures["devices"]
        timing(
            f"list_{key}",
            f"{count:,} devices: state file written → kubelet has the list",
            figures["state_file_to_kubelet"],
            "none set",
            None,
        )
        timing(
            f"list_cpu_{key}",
            f"{count:,} devices: plugin CPU time per list",
            figures["plugin_cpu_per_list"],
            "none set",
            None,
        )
    for key, figures in results["generated_lists"].items():
        timing(
            f"gen_{key}",
            f"{figures['devices']:,} devices (`--count`): process start → first list",
            figures["start_to_first_list"],
            "none set",
            None,
        )
    idle = results["footprint"]["idle"]
    bare_idle = results["footprint"]["idle_bare_grpc_aio"]
    busiest = idle["busiest_thread_wakeups_per_second"]
    timing(
        "idle_wakeups",
        f"idle wake-ups, all threads (busiest thread {busiest:g}/s; bare grpc.aio "
        f"{bare_idle['wakeups_per_second']['mean']:g}/s, busiest "
        f"{bare_idle['busiest_thread_wakeups_per_second']:g}/s)",
        idle["wakeups_per_second"],
        "no thread woken periodically more than once a second",
        busiest <= 1.0,
    )
    timing(
        "idle_cpu",
        f"idle CPU time ({idle['cpu_percent']:g} % over {idle['seconds']:g} s)",
        idle["cpu_ms_per_second"],
        "none set",
        None,
    )
    for entry in results["topology_score"]:
        timing(
            f"topology_{entry['devices']}",
            f"`policies.topology_score`, {entry['devices']} devices, every size (in process)",
            entry["all_sizes"],
            "none set",
            None,
        )

    for key, figures in results["large_lists"].items():
        value(
            f"bytes_{key}",
            f"{figures['devices']:,} devices (`fake-<n>`, no NUMA): bytes on the wire",
            f"{figures['wire_bytes']:,} B ({figures['wire_bytes_per_device']:g} B/device)",
            1,
            "≤ 4 MiB",
            figures["wire_bytes"] <= results["largest_under_limit"]["limit_bytes"],
        )
    for shape in results["largest_under_limit"]["shapes"]:
        value(
            "largest",
            f"largest count within 4 MiB: `{shape['ids']}` IDs, {'with' if shape['numa'] else 'no'} NUMA",
            f"{shape['largest_count']:,} ({shape['bytes_per_device']:g} B/device)",
            1,
            "none set",
            None,
        )
    memory = results["footprint"]["memory"]
    after = memory["vmrss_kib_after_calls"]
    first, last = min(after, key=int), max(after, key=int)
    value(
        "rss_idle",
        f"VmRSS idle ({results['footprint']['plugin']})",
        f"{memory['vmrss_kib_idle'] / MIB:.1f} MiB",
        1,
        "≤ 80 MiB",
        memory["vmrss_kib_idle"] <= 80 * MIB,
    )
    for calls in sorted(after, key=int):
        value(
            f"rss_{calls}",
            f"VmRSS after {int(calls):,} Allocate calls",
            f"{after[calls] / MIB:.1f} MiB",
            1,
            "≤ 80 MiB",
            after[calls] <= 80 * MIB,
        )
    growth = after[last] - after[first]
    value(
        "rss_growth",
        f"VmRSS growth, {int(first):,} → {int(last):,} calls",
        f"{growth:+,} KiB ({growth * 1024 / (int(last) - int(first)):+.2f} B/call)",
        1,
        "none (≤ 1 MiB, allocator noise)",
        growth <= MIB,
    )
    value(
        "load_time",
        f"{memory['calls']:,} Allocate calls: time taken "
        f"(grpc.aio client, {memory['concurrency']} in flight)",
        f"{memory['seconds']:g} s ({memory['calls_per_second']:,} calls/s, plugin CPU "
        f"{memory['plugin_cpu_percent']} %)",
        1,
        "none set",
        None,
    )

    machine = results["machine"]
    wall = results["seconds"].get("wall", results["seconds"]["total"])
    lines = [
        "# Benchmarks",
        "",
        "Measured from the kubelet's side of the socket: a fake kubelet (`devplug.testing.FakeKubelet`)",
        "and raw gRPC clients in the benchmark process, the plugin a separate `devplug-fake` process, as",
        "on a node. Generated by `bench/run.py`; every figure is in `bench/results.json`.",
        "",
        f"Machine: {machine['cores']} cores, Python {machine['python']}, grpcio {machine['grpcio']}, "
        f"{machine['platform']}; {results['date']}; whole run {wall:g} s"
        + (" (**quick run: a smoke test, too few runs to quote**)" if results["quick"] else "")
        + ".",
        "",
        "To rerun: `python bench/run.py` (about 4 minutes on 2 cores; `--quick` for a smoke test that",
        "prints this page and writes nothing). The parts run alone too: `bench/core.py`, `bench/scale.py`,",
        "`bench/footprint.py`, `bench/policies.py`, `bench/dra.py`, `bench/dra_shares.py`,",
        "`bench/nvidia_dra.py`, `bench/real_api.py`; `--only nvidia_dra` (or `dra_shares`, `startup`,",
        "`round_trip`, `real_api`) runs that section again into these results. The machine this ran on",
        "is shared: ±20 % run to run, more when other work runs on it.",
        "",
        "## Times",
        "",
        "| figure | p50 | p99 | max | runs | target | met |",
        "|---|---|---|---|---|---|---|",
        *timing_rows,
        "",
        "## Sizes and memory",
        "",
        "| figure | value | runs | target | met |",
        "|---|---|---|---|---|",
        *value_rows,
        "",
        *render_startup(results, misses),
        *render_dra(results, misses),
        *render_nvidia_dra(results, misses),
        *real_api.render(results, misses),
        "## How each figure is taken",
        "",
        "- Start: from spawning the process to the fake kubelet accepting Register / receiving the first",
        "  ListAndWatch message. Kubelet restart: `FakeKubelet.restart()` (sockets deleted, `kubelet.sock`",
        "  created afresh) to the new Register / first list. Health: a state file rewritten (atomic rename)",
        "  to the stream showing the new health.",
        "- Round trips: a blocking Python gRPC client in a thread, one call at a time, after 200 warm-up",
        "  calls, over the real unix sockets of devplug-fake and of `bench/bare_plugin.py` (a bare grpc.aio",
        "  server answering the same response), both serving at once and called in turn, 50 calls at a",
        "  time, so both see the same load and the framework's own cost is the difference. A Go client",
        "  spends less per call than this Python one, so the ratio to the floor is the figure to read;",
        "  the section on the real API server has Allocate through the kubelet's own Go client.",
        "- Large lists: `devplug-fake --state-file`; the clock starts once the new file is renamed into",
        "  place and stops when the fake kubelet has received the message; each run flips one device's",
        "  health so the whole list is sent again. Bytes are `ListAndWatchResponse.ByteSize()` of the",
        "  message received. The largest counts are computed from the framework's encoding, every device",
        "  `Healthy` (an `Unhealthy` device costs 2 bytes more), NUMA node i mod 2.",
        "- Footprint: one `devplug-fake --config` process serving 3 resources of 100 devices, its three",
        "  ListAndWatch streams open. Idle: CPU time from `/proc/<pid>/stat` and wake-ups (voluntary +",
        "  non-voluntary context switches of every thread in `/proc/<pid>/task/*/status`), one run per",
        "  second, sampled together with an idle bare grpc.aio server for comparison. Memory: VmRSS from",
        "  `/proc/<pid>/status`, idle and after each checkpoint of Allocate calls (one device each,",
        "  spread over the three resources).",
        *DRA_HOW,
        *DRA_SHARES_HOW,
        *NVIDIA_DRA_HOW,
        *real_api.HOW,
    ]
    notes = [
        *explain(results, misses),
        *explain_startup(results, misses),
        *explain_dra(results, misses),
        *explain_nvidia_dra(results, misses),
        *real_api.explain(results, misses),
    ]
    if notes:
        lines += ["", "## Where a target is missed, and why", "", *notes]
    return "\n".join(lines) + "\n", misses


# -- the DRA section ---------------------------------------------------------------------------

DRA_HOW = [
    "- DRA: the driver is `devplug-fake --api dra` (`--count N`, or `--state-file` for health), a",
    "  separate process; FakeKubeAPI (real HTTP/1.1 on 127.0.0.1, a pure-Python server) and the",
    "  kubelet's gRPC clients run in the benchmark process, so the API server's time is part of every",
    "  figure that waits for it. The driver's kubelet root (its checkpoint) is on this machine's disk",
    "  as /var/lib/kubelet is, its CDI directory on tmpfs as /var/run/cdi is.",
    "- NodePrepareResources / NodeUnprepareResources: a blocking gRPC client in a thread, one call at",
    "  a time on one channel; each prepare is of a new claim created and allocated beforehand with",
    "  `FakeKubeAPI.allocate_claim` (untimed), so the driver GETs it, writes its CDI spec and its",
    "  checkpoint; the unprepare that follows removes both; the claim is then deleted (untimed).",
    "  20 warm-up calls per shape first. The floor, `bench/bare_dra.py`, is a bare grpc.aio",
    "  DRAPlugin (v1) doing the same claim GET with lightkube and answering the same shape, writing",
    "  no file; the two are called in alternating blocks. The pieces are a separate pass with",
    "  another driver run through `bench/dra_driver.py --timings`, which wraps some of its functions",
    "  to record their wall time (devplug itself is unchanged).",
    "- Publication: from spawning the driver to the moment FakeKubeAPI holds a complete pool",
    "  (`resourceSliceCount` slices at the highest generation with every device; checked after",
    "  every write); the driver's first API request (`GET` of its Node) marks the end of its imports",
    "  and set-up. Wipe: `FakeKubeAPI.wipe_slices(node)` (what a starting kubelet does) to the pool",
    "  complete again, 0.5 s between wipes. Health: a NodeWatchResources (v1alpha1) stream on the",
    "  DRA socket read by a blocking client in its own thread; the clock starts just before the",
    "  state file is renamed into place and stops when a message with the new health arrives.",
]


def _row(label: str, summary: dict[str, Any], target: str, ok: bool | None, runs: Any = None) -> str:
    cells = " | ".join(_cell(summary, k) for k in ("p50", "p99", "max"))
    return (
        f"| {label} | {cells} | {runs if runs is not None else summary['runs']} | {target} | {_verdict(ok)} |"
    )


_STARTUP_LABELS = {
    "bare_grpc_aio": "bare grpc.aio plugin (`bench/bare_plugin.py`): the floor",
    "bare_with_devplug_libraries": (
        "the bare plugin importing pydantic-settings, structlog, anyio (with its asyncio backend) and "
        "asyncinotify first "
        "(for information)"
    ),
    "devplug_fake": "`devplug-fake`",
    "devplug_run": "`devplug run minimal_plugin:Minimal`",
    "devplug_nvidia_dgx_a100": "`devplug-nvidia --fake-nvml dgx-a100` (for information)",
    "devplug_fake_before": "`devplug-fake` of an older tree (`DEVPLUG_BENCH_BEFORE`)",
}
_STARTUP_TARGETS = {"devplug_fake", "devplug_run"}


def render_startup(results: dict[str, Any], misses: list[str]) -> list[str]:
    """The start-up section (bench/startup.py): start → Register against the bare plugin, imports."""
    figures = results.get("startup")
    if not figures:
        return []
    limit = figures["target_ratio"]
    rows = []
    for name, summary in figures["start_to_register"].items():
        ratio = figures["ratio_p50_to_bare"].get(name)
        ok = ratio <= limit if name in _STARTUP_TARGETS and ratio is not None else None
        if ok is False:
            misses.append(f"startup_{name}")
        cells = " | ".join(_cell(summary, k) for k in ("p50", "p90", "max"))
        target = f"p50 ≤ {limit:g}x the floor" if name in _STARTUP_TARGETS else "none set"
        shown = f"{ratio:.2f}x" if ratio is not None else "1"
        rows.append(
            f"| {_STARTUP_LABELS.get(name, name)} | {cells} | {shown} | {summary['runs']} | {target} "
            f"| {_verdict(ok)} |"
        )
    imports = []
    for label, figure in figures["imports"].items():
        ok = figure["median"] <= 250 if label == "import devplug" else None
        if ok is False:
            misses.append("import_devplug")
        target = "≤ 250 ms" if label == "import devplug" else "none set"
        imports.append(
            f"| `{label}` | {_fmt(figure['median'])} ms | {figure['runs']} | {target} | {_verdict(ok)} |"
        )
    return [
        "## Start-up",
        "",
        "Process start → Register arriving, each subject started in turn in every round against a",
        "minimal Registration server on `kubelet.sock` (`bench/startup.py`: it notes the arrival, answers",
        "at once and dials nothing back, so the figure is the plugin's own start), stopped with SIGTERM",
        "once registered. The packages are byte-compiled first, as installing them does. Measured with",
        "Python's gRPC on both sides (the kubelet's Go client cannot be built here); the ratio to the bare",
        "plugin in the same run is the figure to read.",
        "",
        "| process start → Register | p50 | p90 | max | ÷ floor p50 | runs | target | met |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Imports, timed inside fresh interpreters (median); a console script runs the first three",
        "before its `main()`:",
        "",
        "| import | median | runs | target | met |",
        "|---|---|---|---|---|",
        *imports,
        "",
    ]


def explain_startup(results: dict[str, Any], misses: list[str]) -> list[str]:
    figures = results.get("startup")
    if not figures or not any(m.startswith("startup_") for m in misses):
        return []
    ratios = ", ".join(
        f"{_STARTUP_LABELS[name]} {ratio:.2f}x"
        for name, ratio in figures["ratio_p50_to_bare"].items()
        if name in _STARTUP_TARGETS
    )
    floor = figures["start_to_register"].get("bare_with_devplug_libraries")
    if floor is None:  # results from before that subject existed
        return [f"- **Start → Register, 2x the bare plugin** ({ratios})."]
    bare = figures["start_to_register"]["bare_grpc_aio"]["p50"]
    own = figures.get("devplug_own_ms_p50", {})
    own_text = ", ".join(
        f"{_STARTUP_LABELS[name]} {ms:.0f} ms" for name, ms in own.items() if name in _STARTUP_TARGETS
    )
    return [
        f"- **Start → Register, 2x the bare plugin** ({ratios}): the bare plugin that only imports "
        "the libraries devplug's start needs (pydantic-settings, through which the options are read; "
        "structlog; anyio with its asyncio backend; asyncinotify) and uses none of them already "
        "registers at p50 "
        f"{floor['p50']:.0f} ms, {floor['p50'] / bare:.2f}x the bare plugin's {bare:.0f} ms: no start "
        "that reads its options through pydantic-settings and logs through structlog can meet 2x on "
        "this machine, however little else it does. pydantic-settings alone imports pydantic, "
        "python-dotenv, importlib.metadata and the email package, and pydantic scans the installed "
        "distributions' entry points for its plugins at the first model built. devplug's own part, "
        f"p50 above that floor: {own_text}. It is kept small by reading the field docstrings "
        "(the `--help` text) only when help is printed, building model schemas at first use "
        "(`defer_build`: a device plugin never builds the DRA models, the Allocate answer's models are "
        "built by the first Allocate), and `import devplug` loading nothing until a name is used; "
        "PyYAML, the testing kit, Prometheus and the DRA client load only where used.",
    ]


def render_dra(results: dict[str, Any], misses: list[str]) -> list[str]:
    """The DRA driver's section of the page (empty when the run has no DRA figures)."""
    d = results.get("dra")
    if not d:
        return []
    times: list[str] = []
    values: list[str] = []

    def timing(key: str, label: str, summary: dict[str, Any], target: str, ok: bool | None) -> None:
        if ok is False:
            misses.append(key)
        times.append(_row(label, summary, target, ok))

    def value(key: str, label: str, text: str, runs: int, target: str, ok: bool | None) -> None:  # noqa: PLR0917
        if ok is False:
            misses.append(key)
        values.append(f"| {label} | {text} | {runs} | {target} | {_verdict(ok)} |")

    prep = d["prepare"]
    for method, name in (("prepare", "NodePrepareResources"), ("unprepare", "NodeUnprepareResources")):
        for count in dra.SHAPES:
            key = f"{method}_{count}"
            mine, bare = prep["devplug"][key], prep["bare_grpc_aio"][key]
            ratio = mine["p50"] / bare["p50"]
            shape = f"1 claim x {count} device{'s' if count > 1 else ''}"
            timing(f"dra_{key}", f"{name}, {shape}: devplug", mine, "p50 ≤ 3 ms", mine["p50"] <= 3)
            floor = "bare grpc.aio + lightkube GET" if method == "prepare" else "bare grpc.aio"
            timing(
                f"dra_rel_{key}",
                f"{name}, {shape}: {floor}, no files (the floor); devplug p50 {ratio:.2f}x",
                bare,
                "devplug p50 ≤ 1.2x floor",
                ratio <= 1.2,
            )
    publication = d["publication"]
    for key, figures in publication.items():
        if not key.startswith("devices_"):
            continue
        count = figures["devices"]
        target = count == 10_000
        timing(
            f"dra_publish_{count}",
            f"{count:,} devices ({figures['slices']} slices): process start → all slices complete",
            figures["start_to_complete"],
            "p50 ≤ 2 s" if target else "none set",
            figures["start_to_complete"]["p50"] <= 2000 if target else None,
        )
        timing(
            f"dra_start_api_{count}",
            f"{count:,} devices: process start → the driver's first API request",
            figures["start_to_first_request"],
            "none set",
            None,
        )
        timing(
            f"dra_api_publish_{count}",
            f"{count:,} devices: the driver's first API request → all slices complete",
            figures["first_request_to_complete"],
            "none set",
            None,
        )
    imports = publication["imports"]
    timing(
        "dra_imports",
        "`python -c 'import devplug_fake, devplug._dra.driver, lightkube, …'` (the driver's imports; "
        f"`python -c pass`: {imports['python_start']['p50']:.0f} ms)",
        imports["python_and_imports"],
        "none set",
        None,
    )
    wipes = d["wipes"]
    timing(
        "dra_wipe",
        f"{wipes['devices']:,} devices ({wipes['slices']} slices): "
        "wipe (kubelet start) → all slices complete again",
        wipes["wipe_to_complete"],
        "p99 ≤ 1 s",
        wipes["wipe_to_complete"]["p99"] <= 1000,
    )
    health = d["health"]["health_change_to_stream"]
    timing(
        "dra_health",
        "health change (state file) → NodeWatchResources stream (v1alpha1)",
        health,
        "p99 ≤ 10 ms",
        health["p99"] <= 10,
    )

    for key, figures in publication.items():
        if key.startswith("devices_"):
            value(
                f"dra_cpu_{figures['devices']}",
                f"{figures['devices']:,} devices, start → complete: CPU time of the driver "
                "(with its imports) "
                "/ of FakeKubeAPI (this process)",
                f"{figures['driver_cpu']['p50'] / 1000:.2f} s / "
                f"{figures['api_server_cpu']['p50'] / 1000:.2f} s",
                figures["driver_cpu"]["runs"],
                "none set",
                None,
            )
    writes = wipes["writes_per_wipe"]
    value(
        "dra_wipe_writes",
        "API writes per wipe, until the driver is quiet again",
        ", ".join(f"{count:g} x {verb}" for verb, count in writes.items())
        + f"; pool generation +{wipes['generations_per_wipe']:g}",
        wipes["wipe_to_complete"]["runs"],
        "none set",
        None,
    )
    pieces = prep["devplug_pieces"]
    value(
        "dra_pieces",
        "inside the driver, p50 per call (1 and 8 devices together; `bench/dra_driver.py --timings`)",
        f"NodePrepareResources round trip {pieces['round_trip_prepare']:.2f} ms, "
        f"its handler {pieces['handler_prepare']:.2f} ms: claim GET "
        f"{pieces['claim_get']:.2f} ms, preparing {pieces['prepare_one']:.2f} ms (checkpoint save "
        f"{pieces['thread_checkpoint_save']:.2f} ms, "
        f"CDI spec write {pieces['thread_cdi_spec_write']:.2f} ms, "
        f"each in a worker thread); NodeUnprepareResources round trip "
        f"{pieces['round_trip_unprepare']:.2f} ms, its handler {pieces['handler_unprepare']:.2f} ms",
        pieces["calls"],
        "none set",
        None,
    )
    bd = d["breakdown"]
    value(
        "dra_breakdown",
        "the same pieces alone, in the benchmark process, nothing else running (p50)",
        f"checkpoint save on {prep['checkpoint_filesystem']} {bd['checkpoint_save_disk']:.2f} ms; CDI spec "
        f"write on tmpfs {bd['cdi_spec_write_tmpfs']:.2f} ms, on {prep['checkpoint_filesystem']} "
        f"{bd['cdi_spec_write_disk']:.2f} ms; claim GET, lightkube and FakeKubeAPI in one process "
        f"{bd['claim_get_in_one_process']:.2f} ms",
        bd["runs"],
        "none set",
        None,
    )
    return [
        "## DRA driver (`devplug-fake --api dra`)",
        "",
        f"lightkube {d['lightkube']}; checkpoint on {prep['checkpoint_filesystem']}, CDI specs on "
        f"{prep['cdi_filesystem']}. The API server is FakeKubeAPI in the benchmark process, on the same "
        "2 cores as the driver.",
        "",
        "| figure | p50 | p99 | max | runs | target | met |",
        "|---|---|---|---|---|---|---|",
        *times,
        "",
        "| figure | value | runs | target | met |",
        "|---|---|---|---|---|",
        *values,
        "",
        *render_dra_shares(results),
    ]


DRA_SHARES_HOW = [
    "- Shared devices (`bench/dra_shares.py`, consumable capacity): three `devplug-fake --api dra`",
    "  drivers, each on a node of its own and serving at once, `--count 1` (exclusive) and twice",
    f"  `--count 1 --shares {dra_shares.SHARES}` (capacity `shares: {dra_shares.SHARES}`, a claim takes 1), "
    "with `bench/bare_dra.py`",
    "  beside them. Each call prepares a new one-device claim allocated beforehand by",
    "  `FakeKubeAPI.allocate_claim` (untimed; on the shared drivers each gets a new `shareID`,",
    "  checked in the answer), unprepares it and deletes the claim (untimed), as above. On one",
    f"  shared driver {dra_shares.HELD} other claims' shares are prepared first and stay prepared, so "
    "each measured",
    f"  claim takes the {dra_shares.SHARES}th share and is weighed against them; on the other it is the "
    "only share.",
    f"  The floor is called with the exclusive claims. {dra_shares.WARMUP} warm-up calls per variant, "
    "then the",
    "  four in alternating blocks. The breakdown times, in the benchmark process, the checkpoint",
    f"  encoded and saved with 1 claim and with {dra_shares.SHARES} (the held driver's own file and one "
    "more),",
    "  in turn, and the share check.",
]


def render_dra_shares(results: dict[str, Any]) -> list[str]:
    """The shared-device rows of the DRA section (empty when the run has no such figures)."""
    d = results.get("dra_shares")
    if not d:
        return []
    rows = []
    exclusive = d["variants"]["exclusive"]["prepare"]["p50"]
    for variant in d["variants"].values():
        prepare, unprepare = variant["prepare"], variant["unprepare"]
        cells = " | ".join(_cell(s, k) for s in (prepare, unprepare) for k in ("p50", "p99"))
        rows.append(
            f"| {variant['label']} | {cells} | {prepare['p50'] / exclusive:.2f}x | {prepare['runs']} |"
        )
    bd = d["breakdown"]
    check = bd[f"share_check_{d['held']}_others_us"]
    when = f"{d['date']}" + (" (**quick run**)" if d.get("quick") else "")
    return [
        f"Shared devices (consumable capacity; `bench/dra_shares.py`, taken {when} with `python "
        f"bench/run.py --only dra_shares` or the full run): one device, `--shares {d['shares']}` "
        f"where shared; {d['calls']} calls per variant in {d['blocks']} alternating blocks. No target "
        "set.",
        "",
        "| NodePrepareResources / NodeUnprepareResources, 1 claim x 1 device | prepare p50 | prepare p99 "
        "| unprepare p50 | unprepare p99 | prepare p50 ÷ exclusive | runs |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"What grows with the shares prepared: each save of the checkpoint (every prepare and "
        f"unprepare saves it) encodes every claim it holds; in the benchmark process, encoding "
        f"{d['shares']} claims ({bd['checkpoint_bytes_16_claims']:,} B) takes "
        f"{bd['checkpoint_encode_16_claims']:.2f} ms against {bd['checkpoint_encode_1_claims']:.2f} ms "
        f"for 1 ({bd['checkpoint_bytes_1_claims']:,} B), the whole save "
        f"{bd['checkpoint_save_16_claims']:.2f} ms against {bd['checkpoint_save_1_claims']:.2f} ms; the "
        f"check of a new share against {d['held']} others takes {check:.0f} µs (p50 of {bd['runs']}).",
        "",
    ]


def explain_dra(results: dict[str, Any], misses: list[str]) -> list[str]:
    """A paragraph per missed DRA target, from what profiling these figures found."""
    d = results.get("dra")
    if not d:
        return []
    notes = []
    prep = d["prepare"]
    if any(m.startswith(("dra_prepare", "dra_unprepare", "dra_rel_")) for m in misses):
        mine, bare = prep["devplug"], prep["bare_grpc_aio"]
        pieces, bd = prep["devplug_pieces"], d["breakdown"]
        trip = pieces["round_trip_prepare"]
        get_floor = bare["prepare_1"]["p50"] - bare["unprepare_1"]["p50"]
        handler = pieces["handler_prepare"]
        rest = pieces["prepare_one"] - pieces["thread_checkpoint_save"] - pieces["thread_cdi_spec_write"]

        def share(ms: float) -> str:
            return f"{ms:.2f} ms, {ms / trip * 100:.0f} %"

        notes.append(
            "- **DRA prepare / unprepare: p50 ≤ 3 ms and ≤ 1.2x the floor.** For one device, devplug "
            f"prepares in p50 {mine['prepare_1']['p50']:.2f} ms and unprepares in "
            f"{mine['unprepare_1']['p50']:.2f} ms. The floor itself is "
            f"p50 {bare['prepare_1']['p50']:.2f} ms for a prepare, of which the claim GET and its answer "
            f"take about {get_floor:.2f} ms (the floor's prepare less its unprepare, which is a bare gRPC "
            f"round trip of {bare['unprepare_1']['p50']:.2f} ms): FakeKubeAPI is a pure-Python HTTP server "
            "sharing these 2 cores, and lightkube (httpx, typed models) decodes its answer; the same GET "
            f"with client and server in one process takes {bd['claim_get_in_one_process']:.2f} ms. So "
            "3 ms leaves devplug almost nothing, and neither target allows for the two files a prepare "
            "must write. In the timed pass (a round trip of p50 "
            f"{trip:.2f} ms there) the driver's handler takes {share(handler)} of it, the rest being "
            "gRPC and the client; within the handler the claim GET "
            f"(devplug/_dra/kube.py:Kube.claim) {share(pieces['claim_get'])}; the checkpoint "
            f"(devplug/_dra/checkpoint.py:Checkpoint.save, in a worker thread) "
            f"{share(pieces['thread_checkpoint_save'])}; the CDI spec "
            f"(devplug/_dra/claims.py:Preparer._write_spec) {share(pieces['thread_cdi_spec_write'])}; the "
            f"rest of Preparer._prepare_one {share(rest)} (two hand-overs to a worker thread, the "
            "plugin's allocate, the claim's models and the spec's JSON). An unprepare is mostly the "
            f"checkpoint save again ({pieces['handler_unprepare']:.2f} ms in the handler of a "
            f"{pieces['round_trip_unprepare']:.2f} ms round trip). The checkpoint save costs "
            f"{bd['checkpoint_save_disk']:.2f} ms alone on this disk (fsync of the file, the rename, "
            "fsync of the directory). The checkpoint lives in the driver's state/ directory, which the "
            "socket watcher does not watch, and the spec and the checkpoint are written in one "
            "worker-thread trip (the first version of this benchmark found the checkpoint beside the "
            "DRA socket, where each save's inotify events woke the event loop: 1-device prepare p50 "
            "9.7 ms then). The claim is read with a plain GET decoded straight to a dict (no lightkube "
            "model in between): what is left of the GET is httpx's own work and the wait for the "
            "answer. A durable checkpoint on disk stays: the floor "
            "writes no file, so ≤ 1.2x cannot hold on a disk where one fsynced checkpoint alone costs "
            f"{bd['checkpoint_save_disk'] / bare['prepare_1']['p50'] * 100:.0f} % of the floor's prepare."
        )
    publication = d["publication"]
    big = publication.get("devices_10000")
    if big and "dra_publish_10000" in misses:
        imports = publication["imports"]
        notes.append(
            "- **10,000 devices published within 2 s** is missed: "
            f"p50 {big['start_to_complete']['p50']:,.0f} ms. "
            f"Start → the driver's first API request is {big['start_to_first_request']['p50']:,.0f} ms: "
            f"imports alone take {imports['python_and_imports']['p50']:,.0f} ms "
            f"(`python -c pass`: {imports['python_start']['p50']:.0f} ms). When this benchmark was written, "
            "`python -X importtime` put devplug_fake at about 0.58 s (devplug 0.43 s of it, the "
            "device-plugin runtime devplug._device_plugin.resource and .runner included, which a DRA "
            "driver does not serve; pydantic 0.1 s), and cProfile put devplug/_dra/kube.py:load_client at "
            "0.3 s "
            "(lightkube's import, and the SSL context httpx builds for lightkube.AsyncClient even for "
            "plain HTTP, 0.05 s). The rest, first request "
            f"→ complete ({big['first_request_to_complete']['p50']:,.0f} ms), is bounded by the API server: "
            f"FakeKubeAPI spent {big['api_server_cpu']['p50'] / 1000:.2f} s of CPU on the "
            f"{big['slices']} creates (schema validation and copies of 128-device slices, in Python, on the "
            "same 2 cores). In the driver, devplug/_dra/publisher.py:SlicePublisher builds the 10,000 "
            "device entries (devplug/_dra/slices.py:device_entry, ~80 ms) once per device-set version; "
            "each create goes dict → lightkube ResourceSlice → JSON and back (msgspec decode, "
            "`to_dict()`). What would help further: send and receive slices as plain JSON; import the "
            "device-plugin runtime and lightkube's models only where used (start-up time is its own "
            "open issue)."
        )
    if "dra_wipe" in misses or d["wipes"]["writes_per_wipe"]:
        wipes = d["wipes"]
        failed = sum(v for k, v in wipes["writes_per_wipe"].items() if k.endswith(" 404"))
        if failed:
            notes.append(
                "- **Slices back after a wipe** "
                f"(p50 {wipes['wipe_to_complete']['p50']:.0f} ms, target met unless marked): the kubelet's "
                "DeleteCollection reaches the driver as one DELETED event per slice; "
                "devplug/_dra/publisher.py:SlicePublisher lets a burst of deletions settle for 10 ms "
                "before it writes the pool again, and a 404 on an update drops the slice from its cache "
                f"and plans again at once; {failed:g} updates per wipe still met a slice deleted "
                f"meanwhile (+{wipes['generations_per_wipe']:g} pool generations per wipe)."
            )
    if "dra_health" in misses:
        health = d["health"]["health_change_to_stream"]
        plugin = results.get("restart_and_health", {}).get("health_change_to_kubelet")
        notes.append(
            f"- **DRA health → stream p99 ≤ 10 ms** is missed: p99 {health['p99']:.1f} ms over "
            f"{health['runs']} flips, p50 {health['p50']:.2f} ms."
            + (
                f" The device-plugin path's health figure of the same run has p99 {plugin['p99']:.1f} ms, "
                f"p50 {plugin['p50']:.2f} ms against its 5 ms target: "
                if plugin
                else " "
            )
            + "the tail is a few flips slowed by other work on this shared 2-core machine, not a "
            "steady cost (while this benchmark was written, runs of 150 flips on a quieter machine had "
            "p99 2-8 ms). A flip is one inotify event in devplug-fake, the state file read and "
            "validated, the inventory updated and one NodeWatchResources message; the same change "
            "also makes the publisher replace the device's slice (its taint) through FakeKubeAPI, "
            "whose Python work runs in the benchmark process, the one that reads the stream."
        )
    return notes


# -- devplug-nvidia as a DRA driver -----------------------------------------------------------

NVIDIA_DRA_HOW = [
    "- devplug-nvidia's DRA prepare (`bench/nvidia_dra.py`): `devplug-nvidia --api dra --fake-nvml",
    "  MODEL` for dgx-a100 and mig-mixed (each on a node of its own) and `devplug-fake --api dra",
    "  --count 8`, three processes serving at once; FakeKubeAPI and the blocking gRPC client in the",
    "  benchmark process, as for devplug-fake above. Each call prepares a new claim allocated",
    "  beforehand for the named devices (untimed), checks that NVIDIA's transient YAML spec was",
    "  written, unprepares it (the spec removed) and deletes the claim (untimed); 20 warm-up calls",
    "  per shape, then the three drivers in alternating blocks. The breakdown builds and writes the",
    "  same claim specs in the benchmark process.",
]


def render_nvidia_dra(results: dict[str, Any], misses: list[str]) -> list[str]:
    """devplug-nvidia's DRA section of the page (empty when the run has no such figures)."""
    d = results.get("nvidia_dra")
    if not d:
        return []
    prep = d["prepare"]
    target = prep["target_p50_ms"]
    shapes = prep["shapes"]
    fake = {key: shape for key, shape in shapes.items() if shape["driver"] == "devplug-fake"}
    fake_1 = next(iter(fake.values()))["prepare"]["p50"]
    rows: list[str] = []
    for key, shape in shapes.items():
        mine = shape["driver"] == "devplug-nvidia"
        ok = shape["prepare"]["p50"] <= target if mine else None
        if ok is False:
            misses.append(f"nvidia_dra_prepare_{key}")
        ratio = f"; {shape['prepare']['p50'] / fake_1:.1f}x devplug-fake's 1 device" if mine else ""
        rows.append(
            _row(
                f"NodePrepareResources, {shape['label']}{ratio}",
                shape["prepare"],
                f"p50 ≤ {target:g} ms" if mine else "none set (the same run's devplug-fake)",
                ok,
            )
        )
    for shape in shapes.values():
        rows.append(_row(f"NodeUnprepareResources, {shape['label']}", shape["unprepare"], "none set", None))
    bd = d["breakdown"]
    values = []
    for key, shape in shapes.items():
        pieces = bd.get(key)
        if not pieces:
            continue
        emitter = "libyaml" if pieces["libyaml"] else "PyYAML's pure-Python emitter"
        same = "the same text" if pieces["python_dumper_same_text"] else "**a different text**"
        text = (
            f"claim spec {pieces['claim_spec']:.2f} ms: built {pieces['build']:.2f} ms, written as YAML "
            f"({emitter}) {pieces['spec_yaml']:.2f} ms, {pieces['spec_bytes']:,} B; PyYAML's pure-Python "
            f"emitter {pieces['yaml_python_dumper']:.2f} ms ({same})"
        )
        label = f"{shape['label']}: the claim spec in one process (p50)"
        values.append(f"| {label} | {text} | {bd['runs']} | none set | — |")
    when = f"{d['date']}" + (" (**quick run**)" if d.get("quick") else "")
    return [
        "## devplug-nvidia as a DRA driver (`devplug-nvidia --api dra --fake-nvml MODEL`)",
        "",
        f"Taken {when}, with `python bench/run.py --only nvidia_dra` or the full run; checkpoint on "
        f"{prep['checkpoint_filesystem']}, CDI specs on {prep['cdi_filesystem']}. devplug-fake's rows "
        "are from the same run, for comparison.",
        "",
        "| figure | p50 | p99 | max | runs | target | met |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "| figure | value | runs | target | met |",
        "|---|---|---|---|---|",
        *values,
        "",
    ]


def explain_nvidia_dra(results: dict[str, Any], misses: list[str]) -> list[str]:
    """Why devplug-nvidia's DRA prepare misses its target, from the breakdown of the same run."""
    d = results.get("nvidia_dra")
    missed = [m for m in misses if m.startswith("nvidia_dra_prepare_")]
    if not d or not missed:
        return []
    shapes, bd = d["prepare"]["shapes"], d["breakdown"]
    fake_1 = next(s for s in shapes.values() if s["driver"] == "devplug-fake")["prepare"]["p50"]
    one = shapes["dgx_a100_1_gpu"]["prepare"]["p50"]
    pieces = bd["dgx_a100_1_gpu"]
    note = (
        f"- **devplug-nvidia DRA prepare p50 ≤ {d['prepare']['target_p50_ms']:g} ms** is missed "
        f"({', '.join(m.removeprefix('nvidia_dra_prepare_') for m in missed)}): one GPU on dgx-a100 "
        f"takes p50 {one:.2f} ms, devplug-fake's one device {fake_1:.2f} ms in the same run. Part of "
        "the difference is the claim's CDI spec, built and written in a worker thread "
        "(devplug_nvidia/dra.py:NvidiaDraPlugin.claim_spec): "
        f"{pieces['claim_spec']:.2f} ms in one process, of which {pieces['build']:.2f} ms builds it "
        f"and {pieces['spec_yaml']:.2f} ms writes the {pieces['spec_bytes']:,}-byte spec "
        "(devplug_nvidia/_dra/_cdi.py:spec_yaml: the driver's library mounts and hooks make it long)"
    )
    if "yaml_python_dumper" in pieces:
        emitter = "libyaml's emitter" if pieces["libyaml"] else "the pure-Python emitter (no libyaml here)"
        note += (
            f" with {emitter}; PyYAML's pure-Python emitter takes {pieces['yaml_python_dumper']:.2f} ms"
            + (" for the same text" if pieces["python_dumper_same_text"] else "")
        )
    note += (
        ". What remains is devplug-fake's own prepare, above this target on this shared 2-core machine "
        "(see the DRA prepare note above: the claim GET through FakeKubeAPI and the fsynced checkpoint)."
    )
    return [note]


def explain(results: dict[str, Any], misses: list[str]) -> list[str]:
    """A paragraph per missed target, from what profiling these figures found."""
    notes = []
    trips = results["round_trip"]
    if any(m.startswith("rtt_") and not m.startswith("rtt_rel_") for m in misses):
        floor = trips["bare_grpc_aio"]["allocate_1_device"]
        notes.append(
            "- **Allocate / GetPreferredAllocation p50 ≤ 300 µs.** Not reachable with a Python client on "
            f"this machine: the same client against a bare grpc.aio server with no framework measures "
            f"p50 {floor['p50']:.0f} µs, p99 {floor['p99']:.0f} µs for Allocate — above the target before "
            "devplug does anything. docs/performance.md finds the floor at ~0.4-0.5 ms p50 even from the "
            "kubelet's Go client; the target to hold is the relative one (devplug ≤ 10 % over the floor)."
        )
    rel = [m for m in misses if m.startswith("rtt_rel_")]
    if rel:
        worst = max(
            (trips["devplug"][m[8:]]["p50"] - trips["bare_grpc_aio"][m[8:]]["p50"], m[8:]) for m in rel
        )
        notes.append(
            f"- **devplug ≤ 10 % over the floor** is missed for {', '.join(m[8:] for m in rel)} (at most "
            f"{worst[0]:.0f} µs more, {worst[1]}). The difference is the servicer's per-call Python work "
            "(a cProfile of the plugin over 8,000 Allocate calls, taken when this benchmark was "
            "written: the servicer's handler, the fake's allocate, the model → protobuf conversion, "
            "the host-path check and the metrics took about 10 % of the process's CPU time, some "
            "55 µs a call under the profiler; the rest was grpc.aio's and asyncio's per-call "
            "machinery, which the bare server pays too). Run-to-run noise on this shared machine is "
            "about ±20 %, so compare the two figures of the same run."
        )
    if "idle_wakeups" in misses:
        idle = results["footprint"]["idle"]
        bare = results["footprint"]["idle_bare_grpc_aio"]
        mine = {t["thread"] for t in idle["wakeups_by_thread"] if t["per_second"] > 0}
        python = sum(t["per_second"] for t in idle["wakeups_by_thread"] if t["thread"] == "python")
        notes.append(
            "- **Idle wake-ups.** Every wake-up comes from gRPC C-core's own threads "
            f"({', '.join(sorted(mine))}), none from devplug: its Python threads woke {python:g} times a "
            "second. A bare grpc.aio server with no framework and as many open connections, measured "
            f"over the same seconds, wakes {bare['wakeups_per_second']['mean']:g} times a second, its "
            f"busiest thread {bare['busiest_thread_wakeups_per_second']:g}/s (devplug: "
            f"{idle['wakeups_per_second']['mean']:g}/s, busiest "
            f"{idle['busiest_thread_wakeups_per_second']:g}/s). "
            "The waking threads are grpcio's event-engine thread pool (its workers re-check for work on "
            "a backoff of up to 3 s, its lifeguard at least once a second, by the constants in gRPC's "
            "work_stealing_thread_pool.cc) and its global timer thread; open connections add wake-ups "
            "(when this benchmark was written, a bare server woke about 7/s with no connection and 9/s "
            "with three). devplug cannot change this short of replacing grpcio's event engine. The CPU "
            "it costs is at the 10 ms resolution of /proc/<pid>/stat. A context switch counts as one "
            "wake-up."
        )
    starts = [m for m in misses if m.startswith("start_")]
    if starts:
        start = results["start"]
        notes.append(
            f"- **Process start** ({', '.join(starts)}): the p99 of {start['start_to_register']['runs']} "
            "starts is the slowest start; p50 is "
            f"{start['start_to_register']['p50']:.0f} ms to Register and "
            f"{start['start_to_first_list']['p50']:.0f} ms to the first list. Start-up is mostly imports "
            "(see Start-up, below), so one start slowed by other work on this shared 2-core machine "
            "decides the p99."
        )
    for key in [m for m in misses if m.startswith(("rss", "restart", "health"))]:
        notes.append(f"- **{key}** misses its target in this run; see bench/results.json.")
    lists = results["large_lists"]
    if lists:
        breakdown = results["state_file_breakdown"]
        big = max(lists.values(), key=lambda f: f["devices"])
        generated = results["generated_lists"]
        notes.append(
            "- **Large lists** (no target set). The state-file figures are dominated by devplug-fake "
            "reading the file with PyYAML's pure-Python `yaml.safe_load`: "
            f"{breakdown['yaml_safe_load']:,.0f} ms "
            f"of the plugin's time for {breakdown['devices']:,} devices, against "
            f"{breakdown['validate_state_file']:,.0f} ms validation, {breakdown['to_protobuf']:,.0f} ms "
            f"protobuf conversion, {breakdown['byte_size_and_serialize']:,.0f} ms sizing and "
            f"serialising; `json.loads` reads the same file in {breakdown['json_loads']:,.0f} ms"
            + (
                f" and PyYAML's C loader in {breakdown['yaml_c_safe_loader']:,.0f} ms"
                if "yaml_c_safe_loader" in breakdown
                else ""
            )
            + f". For {big['devices']:,} devices the whole path takes "
            f"{big['state_file_to_kubelet']['p50'] / 1000:.1f} s. The framework's own part shows in the "
            "`--count` rows (no file to parse): start → first list for "
            + ", ".join(
                f"{g['devices']:,} devices {g['start_to_first_list']['p50']:.0f} ms"
                for g in generated.values()
            )
            + f", against {results['start']['start_to_first_list']['p50']:.0f} ms for 4 devices."
            " Reading `.json` state files with `json` (or YAML with `yaml.CSafeLoader`) in devplug-fake"
            " would remove most of the difference."
        )
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer runs; print the table, write nothing")
    parser.add_argument("--out", type=Path, help=f"the JSON results (default: {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--doc", type=Path, help=f"the Markdown page (default: {DOC.relative_to(ROOT)})")
    parser.add_argument(
        "--only",
        choices=ONLY,
        help="run this section alone; its figures replace those of the last full run's results, "
        "and the page is written again from them",
    )
    args = parser.parse_args()
    configure_logging("console", "warning")  # the fake kubelet's info logs would drown the output
    began = time.monotonic()
    if args.only:
        results = json.loads((args.out or RESULTS).read_text())
        results[args.only] = anyio.run(run_section, args.only, args.quick, backend="asyncio")
        results["seconds"][args.only] = round(time.monotonic() - began, 1)
    else:
        results = anyio.run(run_all, args.quick, backend="asyncio")
        results["seconds"]["wall"] = round(time.monotonic() - began, 1)
    page, misses = render(results)
    results["misses"] = misses
    out = args.out or (None if args.quick else RESULTS)
    doc = args.doc or (None if args.quick else DOC)
    wall = results["seconds"].get(args.only or "wall", 0)
    if out:
        out.write_text(json.dumps(results, indent=1) + "\n")
    if doc:
        doc.write_text(page)
    print(page)
    print(
        f"bench: {wall:g} s; misses: {', '.join(misses) or 'none'}"
        + (f"; wrote {out} and {doc}" if out or doc else ""),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
