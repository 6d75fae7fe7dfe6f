"""Every benchmark in one run: writes bench/results.json and the table in docs/benchmarks.md.

    python bench/run.py            # the full run (about 3 minutes on 2 cores)
    python bench/run.py --quick    # a smoke test: fewer runs; prints the table, writes nothing

Measured from the kubelet's side of the socket: a fake kubelet (devplug.testing.FakeKubelet)
and raw gRPC clients run in this process, each plugin is a separate ``devplug-fake`` process.
The pieces run on their own too: bench/core.py, bench/scale.py, bench/footprint.py and
bench/policies.py.
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
import footprint
import policies
import scale

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
}


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
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["seconds"]["total"] = round(sum(results["seconds"].values()), 1)
    return results


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
        "To rerun: `python bench/run.py` (about 3 minutes on 2 cores; `--quick` for a smoke test that",
        "prints this page and writes nothing). The parts run alone too: `bench/core.py`, `bench/scale.py`,",
        "`bench/footprint.py`, `bench/policies.py`. The machine this ran on is shared: ±20 % run to run.",
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
        "## How each figure is taken",
        "",
        "- Start: from spawning the process to the fake kubelet accepting Register / receiving the first",
        "  ListAndWatch message. Kubelet restart: `FakeKubelet.restart()` (sockets deleted, `kubelet.sock`",
        "  created afresh) to the new Register / first list. Health: a state file rewritten (atomic rename)",
        "  to the stream showing the new health.",
        "- Round trips: a blocking Python gRPC client in a thread, one call at a time, after 200 warm-up",
        "  calls; the same client then calls `bench/bare_plugin.py`, a bare grpc.aio server answering the",
        "  same response, so the framework's own cost is the difference.",
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
    ]
    notes = explain(results, misses)
    if notes:
        lines += ["", "## Where a target is missed, and why", "", *notes]
    return "\n".join(lines) + "\n", misses


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
            f"{start['start_to_first_list']['p50']:.0f} ms to the first list. Start-up is mostly imports: "
            "when this benchmark was written, `python -X importtime -c 'import devplug_fake'` put "
            "devplug_fake at about 0.4 s (devplug 0.27 s of it: devplug._core.resource 0.18 s, "
            "devplug.settings 0.07 s, devplug.models 0.05 s; importtime inflates these), so one "
            "start slowed by other work on this shared 2-core machine decides the p99."
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
    args = parser.parse_args()
    configure_logging("console", "warning")  # the fake kubelet's info logs would drown the output
    began = time.monotonic()
    results = anyio.run(run_all, args.quick, backend="asyncio")
    results["seconds"]["wall"] = round(time.monotonic() - began, 1)
    page, misses = render(results)
    results["misses"] = misses
    out = args.out or (None if args.quick else RESULTS)
    doc = args.doc or (None if args.quick else DOC)
    if out:
        out.write_text(json.dumps(results, indent=1) + "\n")
    if doc:
        doc.write_text(page)
    print(page)
    print(
        f"bench: {results['seconds']['wall']:g} s; misses: {', '.join(misses) or 'none'}"
        + (f"; wrote {out} and {doc}" if out or doc else ""),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
