"""devplug beside the Go anchors, against a real kube-apiserver and etcd.

    python bench/real_api.py [--quick] [--out FILE]     # or: python bench/run.py --only real_api

The API server is etcd and kube-apiserver started by ``localnode.control_plane`` from the assets
``e2e/node build`` makes (``KUBEBUILDER_ASSETS``, else ``~/.cache/devplug-e2e/kubernetes-v1.37.2/
assets``). The Go anchors are this repository's own Go module, bench/go, built once into
``~/.cache/devplug-e2e/bench-anchors-<hash>/``:

- ``anchor-driver``: a minimal DRA driver on the kubeletplugin helper of
  k8s.io/dynamic-resource-allocation v0.37.2 (one pool of N devices, a CDI spec and a JSON
  checkpoint written per prepare), the reference devplug-fake is measured against;
- ``anchor-kubelet``: the kubelet's side, from the kubelet's own packages (its DRA plugin manager
  and client, its device-plugin registration server and plugin client), which times the calls.

Figures: NodePrepareResources / NodeUnprepareResources for claims of 1 and 8 devices (created and
allocated in the API server beforehand, untimed), the drivers called in alternating rounds;
publication of 1,000 and 10,000 devices (process start → complete pool in the API server, and
the driver's first API request → complete); the pool back after a wipe (the kubelet's
DeleteCollection of the node's slices); and devplug-fake as a device plugin through the
kubelet's Go client: start → Register, kubelet restart → Register, plugin restart → Register,
Allocate. Where one of devplug's targets is missed, the driver is run again under cProfile and
the functions taking the most time are kept with the figures; for a missed prepare target, also
once more with its pieces timed and no profiler (the handler, the claim GET, the file writes).
Prints JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import core
import dra

sys.path.insert(0, str(core.ROOT / "e2e"))
import localnode

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

GO_MODULE = core.ROOT / "bench" / "go"
BINARIES = ("anchor-driver", "anchor-kubelet")
DEVPLUG = "devplug.example.com"
ANCHOR = "anchor.example.com"
NAMESPACE = "bench"
SIDES = ("devplug", "go_helper")
PREPARE_P50_RATIO, PREPARE_P99_RATIO = 1.5, 2.0
PUBLISH_10K_S = 2.0  # the driver's first API request → 10,000 devices complete
WIPE_P99_S = 1.0

# Run counts: (full, quick).
COUNTS: dict[str, tuple[Any, Any]] = {
    "prepare_calls": (200, 6),
    "prepare_warmup": (20, 2),
    "publications": ({1000: 3, 10_000: 3}, {200: 1}),
    "wipes_devplug": (20, 2),
    "wipes_go_helper": (2, 0),  # the helper restores a wiped pool after its 30 s sync delay
    "dp_starts": (10, 2),
    "dp_restarts": (50, 3),
    "dp_plugin_restarts": (10, 1),
    "dp_calls": (2000, 50),
    "dp_warmup": (200, 10),
    "profile_prepare_calls": (100, 5),
}


def assets() -> Path:
    return Path(os.environ.get("KUBEBUILDER_ASSETS") or localnode.k8s_dir(localnode.DEFAULT_K8S) / "assets")


# -- the Go anchors ------------------------------------------------------------------------------


def anchors_dir() -> Path:
    """Where the anchors of this bench/go are built: keyed by go.mod, go.sum and every .go file."""
    digest = hashlib.sha256()
    for path in sorted(
        p
        for p in GO_MODULE.rglob("*")
        if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))
    ):
        digest.update(str(path.relative_to(GO_MODULE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return localnode.CACHE / f"bench-anchors-{digest.hexdigest()[:16]}"


def build_anchors() -> Path:
    """The directory of the built anchors; builds them when this version is not there yet."""
    out = anchors_dir()
    if all((out / name).is_file() for name in BINARIES):
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    # -trimpath and providerless as e2e/node builds the kubelet: the Go build cache is shared.
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=readonly -buildvcs=false")
    result = subprocess.run(
        ["go", "build", "-trimpath", "-tags", "providerless", "-o", f"{partial}/", "./cmd/..."],
        cwd=GO_MODULE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not all((partial / name).is_file() for name in BINARIES):
        raise RuntimeError(f"building bench/go failed (status {result.returncode}): {result.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    for stale in out.parent.glob("bench-anchors-*"):  # builds of earlier sources (some 140 MB each)
        if stale != out:
            shutil.rmtree(stale, ignore_errors=True)
    return out


class Tools:
    def __init__(self, bin_dir: Path, kubeconfig: Path, logs: Path) -> None:
        self.bin = bin_dir
        self.kubeconfig = kubeconfig
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.runs = 0

    async def kubelet(self, command: str, *args: str) -> dict[str, Any]:
        """One run of anchor-kubelet; its JSON. Its stderr (and its drivers') goes to a log file."""
        self.runs += 1
        log = self.logs / f"{self.runs:03d}-{command}.log"
        argv = [str(self.bin / "anchor-kubelet"), command, "-kubeconfig", str(self.kubeconfig), *args]
        with log.open("wb") as err:
            result = await anyio.run_process(argv, stderr=err, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"anchor-kubelet {command} failed: {log.read_text()[-3000:]}")
        answer: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
        return answer

    def driver(
        self, root: Path, cdi: Path, node: str, devices: int, kubeconfig: str | None = None
    ) -> list[str]:
        return [
            str(self.bin / "anchor-driver"),
            "-driver-name", ANCHOR, "-node-name", node, "-kubeconfig", kubeconfig or str(self.kubeconfig),
            "-plugin-dir", str(root / "plugins" / ANCHOR), "-registry-dir", str(root / "plugins_registry"),
            "-cdi-dir", str(cdi), "-devices", str(devices),
        ]  # fmt: skip


def devplug_driver(  # noqa: PLR0917
    root: Path,
    cdi: Path,
    node: str,
    devices: int,
    kubeconfig: str,
    profile: Path | None = None,
    timings: Path | None = None,
) -> list[str]:
    """``devplug-fake --api dra``; through bench/dra_driver.py when it is profiled (cProfile, with
    DEVPLUG_BENCH_PROFILE set by the caller) or its pieces timed."""
    dra.kubelet_root(root)
    args = [
        "--api", "dra", "--driver-name", DEVPLUG, "--node-name", node, "--kubeconfig", kubeconfig,
        "--kubelet-root", str(root), "--cdi-dir", str(cdi), "--log-level", "warning", "--count", str(devices),
    ]  # fmt: skip
    if timings is not None:
        return [sys.executable, str(core.ROOT / "bench" / "dra_driver.py"), "--timings", str(timings), *args]
    if profile is not None:
        return [sys.executable, str(core.ROOT / "bench" / "dra_driver.py"), *args]
    return [sys.executable, "-m", "devplug_fake", *args]


@asynccontextmanager
async def started(command: list[str], log: Path, env: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """A process with its output in ``log``, stopped with SIGTERM at the end."""
    with log.open("ab") as out:
        process = await anyio.open_process(command, stdout=out, stderr=out, env=env)
    try:
        yield process
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


def _summaries(samples: dict[str, list[float]]) -> dict[str, Any]:
    return {key: core.summary(values) for key, values in samples.items() if values}


# -- the figures -------------------------------------------------------------------------------


async def bench_prepare(tools: Tools, workdir: Path, calls: int, warmup: int) -> dict[str, Any]:
    dp_root, go_root = workdir / "prep-devplug", workdir / "prep-go"
    dp_cdi, go_cdi = dra.cdi_root(), dra.cdi_root()
    try:
        devplug = devplug_driver(dp_root, dp_cdi, "prep-devplug", 8, str(tools.kubeconfig))
        anchor = tools.driver(go_root, go_cdi, "prep-go", 8)
        dra.kubelet_root(go_root)
        async with (
            started(devplug, tools.logs / "prep-devplug.log"),
            started(anchor, tools.logs / "prep-go.log"),
        ):
            answer = await tools.kubelet(
                "dra-prepare", "-namespace", NAMESPACE, "-calls", str(calls), "-warmup", str(warmup),
                "-target", f"name=devplug,driver={DEVPLUG},node=prep-devplug,prefix=fake-,cdi={dp_cdi},"
                f"registration={dp_root / 'plugins_registry' / f'{DEVPLUG}-reg.sock'}",
                "-target", f"name=go_helper,driver={ANCHOR},node=prep-go,prefix=dev-,cdi={go_cdi},"
                f"registration={go_root / 'plugins_registry' / f'{ANCHOR}-reg.sock'}",
            )  # fmt: skip
    finally:
        shutil.rmtree(dp_cdi, ignore_errors=True)
        shutil.rmtree(go_cdi, ignore_errors=True)
    figures: dict[str, Any] = {
        "client": answer["client"],
        "checkpoint_filesystem": dra.filesystem(workdir),
        "cdi_filesystem": dra.filesystem(dp_cdi.parent),
    }
    for side in SIDES:
        figures[side] = _summaries(answer["targets"][side])
    figures["ratio_p50"] = {
        k: round(v["p50"] / figures["go_helper"][k]["p50"], 2) for k, v in figures["devplug"].items()
    }
    figures["ratio_p99"] = {
        k: round(v["p99"] / figures["go_helper"][k]["p99"], 2) for k, v in figures["devplug"].items()
    }
    return figures


async def publish_once(  # noqa: PLR0917
    tools: Tools,
    workdir: Path,
    side: str,
    devices: int,
    run: str,
    wipes: int = 0,
    profile: Path | None = None,
) -> dict[str, Any]:
    root, cdi = workdir / f"pub-{side}-{run}", workdir / f"pub-cdi-{side}-{run}"
    node = "pub-devplug" if side == "devplug" else "pub-go"
    if side == "devplug":
        command = devplug_driver(root, cdi, node, devices, "{kubeconfig}", profile)
        driver = DEVPLUG
    else:
        dra.kubelet_root(root)
        command = tools.driver(root, cdi, node, devices, "{kubeconfig}")
        driver = ANCHOR
    env = {"DEVPLUG_BENCH_PROFILE": str(profile)} if profile is not None else {}
    os.environ.update(env)  # anchor-kubelet starts the driver: it inherits this environment
    try:
        return await tools.kubelet(
            "publish", "-node", node, "-driver", driver, "-devices", str(devices), "-wipes", str(wipes),
            "-relay-kubeconfig", str(workdir / f"relay-{side}-{run}.kubeconfig"), "--", *command,
        )  # fmt: skip
    finally:
        for name in env:
            os.environ.pop(name, None)


async def bench_publication(tools: Tools, workdir: Path, runs: dict[int, int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for devices, n_runs in runs.items():
        samples: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for i in range(n_runs):
            for side in SIDES if i % 2 == 0 else reversed(SIDES):
                samples[side].append(await publish_once(tools, workdir, side, devices, f"{devices}-{i}"))
        entry: dict[str, Any] = {"devices": devices}
        for side in SIDES:
            entry[side] = {
                "slices": samples[side][0]["slices"],
                **{
                    key: core.summary([s[key] for s in samples[side]])
                    for key in (
                        "start_to_complete",
                        "start_to_first_request",
                        "first_request_to_complete",
                        "driver_cpu",
                    )
                },
            }
        results[f"devices_{devices}"] = entry
    return results


async def bench_wipes(
    tools: Tools, workdir: Path, wipes: dict[str, int], devices: int = 1000
) -> dict[str, Any]:
    results: dict[str, Any] = {"devices": devices}
    for side in SIDES:
        if not wipes[side]:
            results[side] = None
            continue
        answer = await publish_once(tools, workdir, side, devices, "wipes", wipes[side])
        results[side] = core.summary(answer["wipe_to_complete"])
    return results


async def bench_device_plugin(tools: Tools, workdir: Path, n: dict[str, int]) -> dict[str, Any]:
    dp_dir = workdir / "device-plugins"
    dp_dir.mkdir(parents=True, exist_ok=True)
    plugin = core.plugin_command(dp_dir, "--count", "8")
    answer = await tools.kubelet(
        "dp", "-dir", str(dp_dir), "-starts", str(n["dp_starts"]), "-restarts", str(n["dp_restarts"]),
        "-plugin-restarts", str(n["dp_plugin_restarts"]), "-calls", str(n["dp_calls"]),
        "-warmup", str(n["dp_warmup"]), "--", *plugin,
    )  # fmt: skip
    client = answer.pop("client")
    figures = {
        key: core.summary(values, "us" if key.startswith("allocate") else "ms")
        for key, values in answer.items()
        if values
    }
    return {"client": client, "devplug_fake": figures}


# -- targets and profiles ------------------------------------------------------------------------


def targets(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """devplug's targets against the Go anchor: value, limit and whether it is met."""
    out: dict[str, dict[str, Any]] = {}
    prep = figures["prepare"]
    for count in (1, 8):
        key = f"prepare_{count}"
        out[f"prepare_p50_{count}"] = {
            "value": prep["ratio_p50"][key], "limit": PREPARE_P50_RATIO, "unit": "x the Go helper",
            "met": prep["ratio_p50"][key] <= PREPARE_P50_RATIO,
        }  # fmt: skip
        out[f"prepare_p99_{count}"] = {
            "value": prep["ratio_p99"][key], "limit": PREPARE_P99_RATIO, "unit": "x the Go helper",
            "met": prep["ratio_p99"][key] <= PREPARE_P99_RATIO,
        }  # fmt: skip
    big = figures["publication"].get("devices_10000")
    if big:
        value = big["devplug"]["first_request_to_complete"]["max"] / 1000
        out["publish_10000"] = {
            "value": round(value, 3),
            "limit": PUBLISH_10K_S,
            "unit": "s",
            "met": value <= PUBLISH_10K_S,
        }
    wipes = figures["wipes"]["devplug"]
    if wipes:
        value = wipes["p99"] / 1000
        out["wipe_p99"] = {
            "value": round(value, 3),
            "limit": WIPE_P99_S,
            "unit": "s",
            "met": value <= WIPE_P99_S,
        }
    return out


def profile_summary(directory: Path, top: int = 12) -> dict[str, Any]:
    """The functions with the most own time (and the most cumulative time) in the driver's profile."""
    (path,) = directory.glob("driver-*.prof")
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())

    def name(func: tuple[str, int, str]) -> str:
        file, line, function = func
        short = file.split("site-packages/")[-1].replace(str(core.ROOT) + "/", "")
        return f"{short}:{line}({function})"

    def rows(index: int) -> list[dict[str, Any]]:
        busy = [item for item in raw.items() if "epoll" not in item[0][2]]  # idle waits left out
        ordered = sorted(busy, key=lambda item: item[1][index], reverse=True)[:top]
        return [
            {
                "function": name(func),
                "calls": entry[1],
                "own_s": round(entry[2], 4),
                "cumulative_s": round(entry[3], 4),
            }
            for func, entry in ordered
        ]

    idle = sum(entry[2] for func, entry in raw.items() if "epoll" in func[2])
    return {
        "total_own_s": round(total, 3),
        "idle_epoll_s": round(idle, 3),
        "by_own_time": rows(2),
        "by_cumulative_time": rows(3),
    }


async def profile_prepare(tools: Tools, workdir: Path, calls: int) -> dict[str, Any]:
    """Two more passes of the driver alone: its pieces timed (no profiler: cProfile slows the
    event loop's Python some twofold), then under cProfile for where the loop's time goes."""
    cdi = dra.cdi_root()
    passes: dict[str, dict[str, Any]] = {}
    try:
        for name in ("timed", "profiled"):
            root, out = workdir / f"prof-prep-{name}", workdir / f"prof-prep-{name}-out"
            command = devplug_driver(
                root, cdi, "prep-devplug", 8, str(tools.kubeconfig),
                profile=out if name == "profiled" else None, timings=out if name == "timed" else None,
            )  # fmt: skip
            env = dict(os.environ, DEVPLUG_BENCH_PROFILE=str(out)) if name == "profiled" else None
            async with started(command, tools.logs / f"prof-prep-{name}.log", env):
                passes[name] = await tools.kubelet(
                    "dra-prepare", "-namespace", NAMESPACE, "-calls", str(calls), "-warmup", "5",
                    "-blocks", "1", "-target", f"name={name},driver={DEVPLUG},node=prep-devplug,prefix=fake-,"
                    f"registration={root / 'plugins_registry' / f'{DEVPLUG}-reg.sock'}",
                )  # fmt: skip
    finally:
        shutil.rmtree(cdi, ignore_errors=True)
    (pieces_file,) = (workdir / "prof-prep-timed-out").glob("driver-*.json")
    timed = {
        name: piece["p50_ms"]
        for name, piece in json.loads(pieces_file.read_text()).items()
        if not name.startswith("reconcile")
    }
    samples = passes["timed"]["targets"]["timed"]
    client = {key: core.summary(values)["p50"] for key, values in samples.items()}
    return {
        "what": f"{calls} prepares + unprepares each of 1 and 8 devices, twice",
        "pieces_p50_ms": timed,
        "client_p50_ms": client,
        **profile_summary(workdir / "prof-prep-profiled-out"),
    }


async def profile_publication(tools: Tools, workdir: Path, devices: int, wipes: int) -> dict[str, Any]:
    prof = workdir / f"prof-pub-{devices}-{wipes}"
    await publish_once(tools, workdir, "devplug", devices, f"prof-{wipes}", wipes, prof)
    what = f"publication of {devices:,} devices" + (f" and {wipes} wipes" if wipes else "")
    return {"what": what, **profile_summary(prof)}


# -- the section ---------------------------------------------------------------------------------


async def bench(workdir: Path, quick: bool) -> dict[str, Any]:
    """Every figure of this section; ``{"skipped": reason}`` where there are no assets."""
    n = {name: value[1 if quick else 0] for name, value in COUNTS.items()}
    where = assets()
    if not (where / "kube-apiserver").is_file():
        return {"skipped": f"no kube-apiserver in {where} (KUBEBUILDER_ASSETS; e2e/node build makes one)"}
    bin_dir = await anyio.to_thread.run_sync(build_anchors)
    run = Path(tempfile.mkdtemp(prefix="dpreal-", dir="/tmp"))
    figures: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "kubernetes": localnode.DEFAULT_K8S,
        "anchors": str(bin_dir),
    }
    try:
        node = await anyio.to_thread.run_sync(localnode.control_plane, run / "api", where)
        tools = Tools(bin_dir, node.kubeconfig, workdir / "real-api-logs")
        nodes = ["prep-devplug", "prep-go", "pub-devplug", "pub-go"]
        await tools.kubelet("setup", "-namespace", NAMESPACE, "-nodes", ",".join(nodes))
        figures["prepare"] = await bench_prepare(tools, workdir, n["prepare_calls"], n["prepare_warmup"])
        figures["publication"] = await bench_publication(tools, workdir, n["publications"])
        wipes = {"devplug": n["wipes_devplug"], "go_helper": n["wipes_go_helper"]}
        figures["wipes"] = await bench_wipes(tools, workdir, wipes)
        figures["device_plugin"] = await bench_device_plugin(tools, workdir, n)
        figures["targets"] = targets(figures)
        missed = {key for key, target in figures["targets"].items() if not target["met"]}
        profiles: dict[str, Any] = {}
        if any(key.startswith("prepare_") for key in missed):
            profiles["prepare"] = await profile_prepare(tools, workdir, n["profile_prepare_calls"])
        if "publish_10000" in missed:
            profiles["publication"] = await profile_publication(tools, workdir, 10_000, 0)
        if "wipe_p99" in missed:
            profiles["wipes"] = await profile_publication(tools, workdir, 1000, n["wipes_devplug"])
        figures["profiles"] = profiles
    finally:
        await anyio.to_thread.run_sync(lambda: localnode.down(run / "api", quiet=True))
        shutil.rmtree(run, ignore_errors=True)
    return figures


# -- the page (docs/benchmarks.md, through bench/run.py) -------------------------------------------

HOW = [
    "- devplug beside the Go anchors (`bench/real_api.py`, `python bench/run.py --only real_api`):",
    "  etcd and kube-apiserver v1.37.2 started by `localnode.control_plane` from the assets",
    "  `e2e/node build` makes (`KUBEBUILDER_ASSETS`, else its cache); no kubelet, the Node objects",
    "  created by hand. The Go anchors are this repository's own Go module `bench/go`, built once",
    "  (`go build -trimpath`) into `~/.cache/devplug-e2e/bench-anchors-<hash of its sources>/`:",
    "  `anchor-driver`, a minimal DRA driver on the kubeletplugin helper of",
    "  k8s.io/dynamic-resource-allocation v0.37.2 (N devices in one pool of slices of 128, a CDI",
    "  spec per claim on prepare and a JSON checkpoint, fsynced and renamed into place; its API client",
    "  without client-go's default 5 requests/s throttle), and `anchor-kubelet`, the kubelet's side",
    "  from the kubelet's own packages, which times every call itself.",
    "- Prepare / unprepare here: `anchor-kubelet dra-prepare` registers each driver as the plugin",
    "  watcher does (GetInfo, then the kubelet's DRA handler `DRAPluginManager.RegisterPlugin`, then",
    "  NotifyRegistrationStatus) and calls it through the kubelet's DRA plugin client",
    "  (`k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin`, `DRAPlugin.NodePrepareResources`). Each call",
    "  is a new claim created and allocated (its `status.allocation` written with a status update)",
    "  beforehand and deleted after its unprepare, all untimed; both drivers GET it from the API",
    "  server. Warm-up calls first, then rounds alternating between the two drivers (order swapped",
    "  every round). devplug-fake and the anchor each run on a Node of their own.",
    "- Publication here: `anchor-kubelet publish` watches the node's ResourceSlices (list + watch,",
    "  field selectors `spec.nodeName`, `spec.driver`) and starts the driver; complete = the watch",
    "  has shown `resourceSliceCount` slices at the highest generation holding every device. The",
    "  driver's kubeconfig points at a TCP relay in front of the API server: its first connection",
    "  is the driver's first API request. Wipe: `DeleteCollection` of the node's slices (field",
    "  selector `spec.nodeName`, what the kubelet sends at its start) to the pool complete again,",
    "  0.5 s between wipes. The helper's slice controller resyncs a pool `DefaultSyncDelay` (30 s)",
    "  after a change it did not make, which is what its wipe figure shows.",
    "- Device plugin through the kubelet's Go client: `anchor-kubelet dp` serves the kubelet's",
    "  registration server (`devicemanager/plugin/v1beta1.NewServer`, which dials the plugin back",
    "  before Register returns, then runs its ListAndWatch client). Start → Register: process",
    "  spawned to the kubelet's `PluginConnected`. Kubelet restart: a new server started (it",
    "  removes the directory's sockets and makes `kubelet.sock` afresh) to the next Register.",
    "  Plugin restart: SIGTERM, exit and a new process to Register. Allocate: through the",
    "  connection the kubelet's plugin client made, one call at a time, after warm-up calls.",
]

_LABELS = {
    "start_to_complete": "process start → pool complete",
    "first_request_to_complete": "first API request → pool complete",
    "start_to_first_request": "process start → first API request",
}


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.2f} ms"


def render(results: dict[str, Any], misses: list[str]) -> list[str]:  # noqa: PLR0912
    """The section of docs/benchmarks.md; appends the IDs of missed targets to ``misses``."""
    d = results.get("real_api")
    if not d:
        return []
    title = "## devplug beside the Go anchors, on a real API server"
    if "skipped" in d:
        return [title, "", f"Not measured in this run: {d['skipped']}.", ""]
    goals = d["targets"]
    for key, goal in goals.items():
        if not goal["met"]:
            misses.append(f"real_api_{key}")

    def verdict(key: str) -> str:
        return "—" if key not in goals else ("yes" if goals[key]["met"] else "**no**")

    prep = d["prepare"]
    rows = []
    for method, label in (("prepare", "NodePrepareResources"), ("unprepare", "NodeUnprepareResources")):
        for count in (1, 8):
            key = f"{method}_{count}"
            mine, go = prep["devplug"][key], prep["go_helper"][key]
            target = (
                f"p50 ≤ {PREPARE_P50_RATIO:g}x, p99 ≤ {PREPARE_P99_RATIO:g}x"
                if method == "prepare"
                else "none set"
            )
            met = (
                " / ".join((verdict(f"prepare_p50_{count}"), verdict(f"prepare_p99_{count}")))
                if method == "prepare"
                else "—"
            )
            rows.append(
                f"| {label}, 1 claim x {count} device{'s' if count > 1 else ''} | {_ms(mine['p50'])} | "
                f"{_ms(mine['p99'])} | {_ms(go['p50'])} | {_ms(go['p99'])} | {prep['ratio_p50'][key]:.2f}x | "
                f"{prep['ratio_p99'][key]:.2f}x | {mine['runs']} | {target} | {met} |"
            )
    pub_rows = []
    for entry in d["publication"].values():
        count = entry["devices"]
        for figure, label in _LABELS.items():
            mine, go = entry["devplug"][figure], entry["go_helper"][figure]
            target, met = "none set", "—"
            if figure == "first_request_to_complete" and count == 10_000:
                target, met = f"devplug ≤ {PUBLISH_10K_S:g} s (slowest run)", verdict("publish_10000")
            pub_rows.append(
                f"| {count:,} devices ({entry['devplug']['slices']} slices): {label} | {_ms(mine['p50'])} "
                f"| {_ms(mine['max'])} | {_ms(go['p50'])} | {_ms(go['max'])} | {mine['runs']} | {target} "
                f"| {met} |"
            )
        mine, go = entry["devplug"]["driver_cpu"], entry["go_helper"]["driver_cpu"]
        pub_rows.append(
            f"| {count:,} devices: driver CPU time until complete | {_ms(mine['p50'])} "
            f"| {_ms(mine['max'])} | {_ms(go['p50'])} | {_ms(go['max'])} | {mine['runs']} | none set | — |"
        )
    wipes = d["wipes"]
    mine, go = wipes["devplug"], wipes["go_helper"]
    go_cells = f"{_ms(go['p50'])} | {_ms(go['max'])}" if go else "not measured (quick run) | —"
    pub_rows.append(
        f"| {wipes['devices']:,} devices: wipe → pool complete again | {_ms(mine['p50'])} | "
        f"{_ms(mine['p99'])} | {go_cells} | {mine['runs']}"
        + (f" / {go['runs']}" if go else "")
        + f" | devplug p99 ≤ {WIPE_P99_S:g} s | {verdict('wipe_p99')} |"
    )
    dp = d["device_plugin"]["devplug_fake"]
    dp_rows = []
    for key, label in (
        ("start_to_register", "process start → Register (the kubelet dialled back)"),
        ("start_to_first_list", "process start → first ListAndWatch list"),
        ("kubelet_restart_to_register", "kubelet restart → Register"),
        ("plugin_restart_to_register", "plugin restart (SIGTERM, exit, start) → Register"),
        ("allocate_1", "Allocate, 1 device"),
        ("allocate_8", "Allocate, 8 devices"),
    ):
        if key in dp:
            cells = " | ".join(_cell(dp[key], k) for k in ("p50", "p99", "max"))
            dp_rows.append(f"| {label} | {cells} | {dp[key]['runs']} |")
    when = d["date"] + (" (**quick run: a smoke test, too few runs to quote**)" if d.get("quick") else "")
    lines = [
        title,
        "",
        f"Taken {when} with `python bench/run.py --only real_api` or the full run: kube-apiserver and etcd "
        f"{d['kubernetes']}; the kubelet's side is the kubelet's own Go packages; devplug-fake "
        "(`--api dra`) beside a minimal driver on the Go helper (`kubeletplugin`), each driver a separate "
        f"process. Checkpoints on {prep['checkpoint_filesystem']}, CDI specs on {prep['cdi_filesystem']}.",
        "",
        "| figure | devplug p50 | devplug p99 | Go helper p50 | Go helper p99 | p50 ÷ Go | p99 ÷ Go | runs "
        "| target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "| figure | devplug p50 | devplug max | Go helper p50 | Go helper max | runs | target | met |",
        "|---|---|---|---|---|---|---|---|",
        *pub_rows,
        "",
        "devplug-fake as a device plugin, through the kubelet's own registration server and plugin client:",
        "",
        "| figure | p50 | p99 | max | runs |",
        "|---|---|---|---|---|",
        *dp_rows,
        "",
    ]
    profiles = d.get("profiles") or {}
    for name, prof in profiles.items():
        top = ", ".join(
            f"`{row['function']}` {row['own_s'] * 1000:,.0f} ms" for row in prof["by_own_time"][:6]
        )
        lines.append(
            f"Profile of devplug-fake ({name}: {prof['what']}; cProfile, the event loop's thread, "
            f"{prof['total_own_s']:.2f} s in all of which {prof['idle_epoll_s']:.2f} s waiting in epoll): "
            f"most own time in {top}."
        )
        if "pieces_p50_ms" in prof:
            pieces = ", ".join(f"{k} {v:.2f}" for k, v in prof["pieces_p50_ms"].items())
            lines.append(
                f"Pieces of a pass without the profiler (wall time inside the driver, p50 ms): {pieces}."
            )
        lines.append("")
    return lines


def _cell(summary: dict[str, Any], key: str) -> str:
    unit = "µs" if summary["unit"] == "us" else summary["unit"]
    value = summary[key]
    text = f"{value:,.0f}" if value >= 100 else (f"{value:.1f}" if value >= 10 else f"{value:.2f}")
    return f"{text} {unit}"


def explain(results: dict[str, Any], misses: list[str]) -> list[str]:
    """A note per missed target of this section, from the profile taken in the same run."""
    d = results.get("real_api")
    if not d or "skipped" in d:
        return []
    notes = []
    missed = [m.removeprefix("real_api_") for m in misses if m.startswith("real_api_")]
    prep_missed = [m for m in missed if m.startswith("prepare_")]
    if prep_missed:
        prep = d["prepare"]
        ratios = ", ".join(f"{m} {d['targets'][m]['value']:.2f}x" for m in prep_missed)
        note = (
            f"- **Real API server, prepare against the Go helper** ({ratios}): devplug-fake prepares one "
            f"device in p50 {prep['devplug']['prepare_1']['p50']:.2f} ms, the helper in "
            f"{prep['go_helper']['prepare_1']['p50']:.2f} ms; both make the same claim GET to the same API "
            "server and write a CDI spec and an fsynced checkpoint."
        )
        prof = d.get("profiles", {}).get("prepare")
        if prof and "pieces_p50_ms" in prof:
            note += _prepare_pieces(prof)
        notes.append(note)
    if "publish_10000" in missed:
        big = d["publication"]["devices_10000"]
        notes.append(
            f"- **10,000 devices within {PUBLISH_10K_S:g} s of the first API request** is missed: slowest "
            f"{big['devplug']['first_request_to_complete']['max'] / 1000:.2f} s (the Go helper "
            f"{big['go_helper']['first_request_to_complete']['max'] / 1000:.2f} s); see the profile above."
        )
    if "wipe_p99" in missed:
        notes.append(
            f"- **Wipe → back p99 ≤ {WIPE_P99_S:g} s** is missed: p99 "
            f"{d['wipes']['devplug']['p99'] / 1000:.2f} s; see the profile above."
        )
    return notes


def _prepare_pieces(prof: dict[str, Any]) -> str:
    """Where a prepare's time goes, from the timed pass (p50 of each piece) and the profiled one."""
    p, client = prof["pieces_p50_ms"], prof.get("client_p50_ms", {})
    needed = ("handler_prepare", "claim_get", "thread_cdi_spec_write", "thread_checkpoint_save")
    if not all(key in p for key in needed) or "prepare_1" not in client:
        return ""
    handler, get = p["handler_prepare"], p["claim_get"]
    hop = p.get("to_thread_awaited", p["thread_cdi_spec_write"] + p["thread_checkpoint_save"])
    note = (
        " Where devplug's time goes, in a pass of the driver alone with its pieces timed (no "
        f"profiler; p50): the kubelet's call {client['prepare_1']:.2f} ms (1 device), of which the "
        f"NodePrepareResources handler {handler:.2f} ms, so {client['prepare_1'] - handler:.2f} ms "
        "outside it (gRPC aio's server and the event loop's wake-ups); in the handler, the claim GET "
        f"{get:.2f} ms, the CDI spec write ({p['thread_cdi_spec_write']:.2f} ms) and the fsynced "
        f"checkpoint ({p['thread_checkpoint_save']:.2f} ms) in a worker thread, {hop:.2f} ms as "
        f"awaited with the trips there and back, and {handler - get - hop:.2f} ms for the rest (the "
        "lock, the claim's devices, the plugin's allocate, the spec's text)."
    )
    cpu_get = next((r for r in prof["by_cumulative_time"] if r["function"].endswith("(claim)")), None)
    if cpu_get is not None:
        cpu = cpu_get["cumulative_s"] * 1000 / cpu_get["calls"]
        note += (
            f" Of the GET, the event loop's CPU is some {cpu:.2f} ms under cProfile (httpx building "
            "and sending the request through its connection pool, h11 and TLS, and reading the "
            "answer; the claim goes from JSON straight to a dict); the rest is the API server's "
            "answer and the loop's wake-up. The profile's largest own times are the event loop's "
            "callbacks (`Context.run`: gRPC aio's and the loop's C-level work) and socket sends."
        )
    return note


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        return {"machine": core.machine_info(), "real_api": await bench(workdir, quick)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
