"""Process start → Register: devplug's commands against a bare grpc.aio plugin, in one run.

    python bench/startup.py [--quick] [--out bench/results-startup.json]

The kubelet's side is a minimal Registration server in this process, on ``kubelet.sock`` of a
fresh directory per start: it notes the moment a Register arrives (``time.monotonic()``),
answers at once and dials nothing back, so the figure is the plugin's own start (interpreter,
imports, settings, serving its socket) and nothing of a kubelet's. Each round starts every
subject once, in turn, so a change in the machine's load falls on all of them alike; the
process is stopped with SIGTERM as soon as it has registered.

Subjects: ``bench/bare_plugin.py`` (a bare grpc.aio plugin that serves, then registers), the
same bare plugin importing the libraries devplug needs to start (pydantic-settings, structlog,
anyio and its asyncio backend, asyncinotify) and using none of them (the floor for any plugin
built on them),
the ``devplug-fake`` console script, ``devplug run`` with bench/minimal_plugin.py, and
``devplug-nvidia --fake-nvml dgx-a100`` (for information: NVML discovery of a model machine).

Also the import cost: ``import devplug`` and the console scripts' imports before ``main()``,
timed inside fresh interpreters (median of several). Prints JSON.

With ``DEVPLUG_BENCH_BEFORE=DIR`` (an older tree, ``git archive`` of devplug, devplug_fake and
devplug_nvidia unpacked in DIR) that tree's devplug-fake starts in every round too, as
``devplug_fake_before``: before and after from one run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
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

BIN = Path(sys.executable).parent
BENCH = core.ROOT / "bench"
RESOURCE = "example.com/bare"
BASELINE = "bare_grpc_aio"
# The bare plugin that first imports the libraries devplug's start needs (settings through
# pydantic-settings, logs through structlog, anyio, inotify) and uses none of them: what any
# plugin built on them pays before it can register, devplug's own code aside.
WITH_LIBRARIES = "bare_with_devplug_libraries"
# anyio._backends._asyncio: what anyio.run loads to run on asyncio, as every anyio program does.
LIBRARIES = "pydantic_settings,structlog,anyio,anyio._backends._asyncio,asyncinotify"
# Another source tree of devplug (``git archive OLD devplug devplug_fake devplug_nvidia``
# unpacked there) whose devplug-fake also starts each round: before/after figures, one run.
BEFORE = os.environ.get("DEVPLUG_BENCH_BEFORE", "")
RUNS = {False: 15, True: 3}  # starts of each subject: full run, --quick
IMPORT_RUNS = {False: 9, True: 3}
TARGET_RATIO = 2.0  # devplug's p50 start → Register at most twice the bare plugin's

# What a console script does before calling its function, and references for scale.
IMPORTS = {
    "import devplug": "import devplug",
    "devplug-fake before main()": "from devplug_fake import main",
    "devplug before main()": "from devplug.cli import main",
    "devplug-nvidia before main()": "from devplug_nvidia.__main__ import main",
    "import devplug.models (pydantic)": "import devplug.models",
    "import grpc + api_pb2 (bare plugin)": (
        "import grpc.aio; import devplug._proto.deviceplugin.v1beta1.api_pb2_grpc"
    ),
}
_TIMED = (
    "import time; t = time.perf_counter(); {stmt}; "
    "import sys; sys.stdout.write(repr(time.perf_counter() - t))"
)


def _script(name: str, module: str) -> list[str]:
    """The installed console script, or ``python -m module`` where it is not installed."""
    path = BIN / name
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def subjects(directory: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Name → (command, extra environment) of each plugin started against ``directory``."""
    common = ["--device-plugin-dir", str(directory), "--log-level", "warning"]
    bench_path = {"PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))}
    return {
        BASELINE: (
            [
                sys.executable,
                str(BENCH / "bare_plugin.py"),
                str(directory / "bare.sock"),
                str(directory / "kubelet.sock"),
                RESOURCE,
            ],
            {},
        ),
        WITH_LIBRARIES: (
            [
                sys.executable,
                str(BENCH / "bare_plugin.py"),
                str(directory / "bare.sock"),
                str(directory / "kubelet.sock"),
                RESOURCE,
            ],
            {"BARE_PLUGIN_IMPORTS": LIBRARIES},
        ),
        "devplug_fake": ([*_script("devplug-fake", "devplug_fake"), *common], {}),
        "devplug_run": (
            [*_script("devplug", "devplug"), "run", "minimal_plugin:Minimal", *common],
            bench_path,
        ),
        "devplug_nvidia_dgx_a100": (
            [*_script("devplug-nvidia", "devplug_nvidia"), "--fake-nvml", "dgx-a100", *common],
            {},
        ),
        **(
            {"devplug_fake_before": ([str(BIN / "devplug-fake"), *common], {"PYTHONPATH": BEFORE})}
            if BEFORE
            else {}
        ),
    }


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """The kubelet's Register, reduced to noting when it arrives."""

    def __init__(self) -> None:
        self.arrived = anyio.Event()
        self.at: float | None = None

    async def Register(self, request: Any, context: Any) -> Any:
        if self.at is None:
            self.at = time.monotonic()
            self.arrived.set()
        return pb.Empty()


async def start_to_register(directory: Path, command: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``command`` to its first Register on ``directory/kubelet.sock``."""
    await anyio.Path(directory).mkdir(parents=True)
    registration = _Registration()
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(registration, server)
    server.add_insecure_port(f"unix:{directory / 'kubelet.sock'}")
    await server.start()
    try:
        began = time.monotonic()
        async with core.started(command, env={**os.environ, **env}):
            with anyio.fail_after(60):
                await registration.arrived.wait()
        assert registration.at is not None
        return registration.at - began
    finally:
        await server.stop(0)


def _summary(samples_s: list[float]) -> dict[str, Any]:
    figures = core.summary(samples_s)
    ordered = sorted(samples_s)
    figures["p90"] = round(ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))] * 1e3, 3)
    return figures


async def bench_startup(workdir: Path, runs: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    for i in range(runs):
        for name in subjects(workdir):
            directory = workdir / f"r{i}" / name
            command, env = subjects(directory)[name]
            samples.setdefault(name, []).append(await start_to_register(directory, command, env))
    figures = {name: _summary(values) for name, values in samples.items()}
    bare = figures[BASELINE]["p50"]
    ratios = {name: round(f["p50"] / bare, 2) for name, f in figures.items() if name != BASELINE}
    floor = figures[WITH_LIBRARIES]["p50"]
    own = {
        name: round(f["p50"] - floor, 1)
        for name, f in figures.items()
        if name not in (BASELINE, WITH_LIBRARIES)
    }
    return {
        "start_to_register": figures,
        "ratio_p50_to_bare": ratios,
        "target_ratio": TARGET_RATIO,
        # p50 above the bare plugin that imports devplug's libraries: devplug's own start (ms).
        "devplug_own_ms_p50": own,
    }


def import_times(runs: int) -> dict[str, Any]:
    """Each statement timed inside ``runs`` fresh interpreters (cwd: the repository root)."""
    results: dict[str, Any] = {}
    for label, stmt in IMPORTS.items():
        samples = []
        for _ in range(runs):
            out = subprocess.run(
                [sys.executable, "-c", _TIMED.format(stmt=stmt)],
                cwd=core.ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            samples.append(float(out))
        results[label] = {"unit": "ms", "runs": runs, "median": round(statistics.median(samples) * 1e3, 1)}
    return results


def byte_compile() -> None:
    """Compile the packages to bytecode first, as installing them does.

    Without it (a source checkout run with PYTHONDONTWRITEBYTECODE set, as in CI), every start
    compiles devplug's modules again, tens of milliseconds that no installed plugin pays.
    """
    roots = [core.ROOT, *([Path(BEFORE)] if BEFORE else [])]
    packages = [str(root / name) for root in roots for name in ("devplug", "devplug_fake", "devplug_nvidia")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


async def main_async(quick: bool) -> dict[str, Any]:
    byte_compile()
    with tempfile.TemporaryDirectory(prefix="dps-", dir="/tmp") as tmp:
        results: dict[str, Any] = {"machine": core.machine_info()}
        results.update(await bench_startup(Path(tmp), RUNS[quick]))
        results["imports"] = await anyio.to_thread.run_sync(import_times, IMPORT_RUNS[quick])
        return results


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
