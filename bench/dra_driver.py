"""``devplug-fake`` with measuring hooks: what bench/dra.py runs when one of these is set.

    DEVPLUG_BENCH_PROFILE=DIR python bench/dra.py --quick   # cProfile: DIR/driver-<pid>.prof
    DEVPLUG_BENCH_TIMINGS=DIR python bench/dra.py --quick   # wall time of pieces: DIR/driver-<pid>.json
    python bench/dra_driver.py --timings DIR ARGS            # the same for one driver

Every driver process the benchmark starts then runs as ``python bench/dra_driver.py ARGS``
instead of ``python -m devplug_fake ARGS`` and writes its file when it exits on SIGTERM.

- cProfile starts once the driver's modules are imported (PRELOADED), and sees the event
  loop's thread only: work handed to worker threads (file writes,
  fsync) shows as the wait for them, and gRPC C-core's threads not at all; a coroutine counts
  one call per resumption.
- The timings wrap a few of the driver's functions (in this process only; devplug is not
  changed) and record the wall time of each call: the DRAPlugin handlers, the claim GET, the
  CDI spec write and the checkpoint save (each in its worker thread, and as awaited by the
  event loop), the publisher's reconcile and its device entries. The JSON holds, per piece,
  the number of calls, total, mean and p50 seconds.
"""

from __future__ import annotations

import cProfile
import functools
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROFILE_ENV = "DEVPLUG_BENCH_PROFILE"
TIMINGS_ENV = "DEVPLUG_BENCH_TIMINGS"

samples: dict[str, list[float]] = {}
PRELOADED = (
    "devplug._dra.driver",
    "lightkube",
    "lightkube.resources.core_v1",
    "lightkube.resources.resource_v1",
)


def _timed(owner: Any, attribute: str, label: str) -> None:
    original = getattr(owner, attribute)
    record = samples.setdefault(label, [])
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                record.append(time.perf_counter() - before)

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                record.append(time.perf_counter() - before)

    setattr(owner, attribute, wrapper)


def install_timings() -> None:
    import anyio.to_thread

    from devplug._dra import claims, kube, publisher, servicer
    from devplug._dra.checkpoint import Checkpoint

    _timed(servicer.DraPluginService, "NodePrepareResources", "handler_prepare")
    _timed(servicer.DraPluginService, "NodeUnprepareResources", "handler_unprepare")
    _timed(kube.Kube, "claim", "claim_get")
    _timed(claims.Preparer, "_prepare_one", "prepare_one")
    _timed(claims.Preparer, "_unprepare_one", "unprepare_one")
    _timed(claims.Preparer, "_write_spec", "thread_cdi_spec_write")
    _timed(Checkpoint, "save", "thread_checkpoint_save")
    _timed(publisher.SlicePublisher, "_reconcile", "reconcile")
    _timed(publisher.SlicePublisher, "_wanted", "reconcile_device_entries")
    _timed(publisher, "plan", "reconcile_plan")
    # Every hop to a worker thread as the event loop awaits it (the work plus the hand-over).
    _timed(anyio.to_thread, "run_sync", "to_thread_awaited")  # looked up per call: wrapped everywhere


def dump_timings(path: Path) -> None:
    out = {}
    for label, values in samples.items():
        if values:
            out[label] = {
                "calls": len(values),
                "total_s": round(sum(values), 6),
                "mean_ms": round(statistics.fmean(values) * 1e3, 4),
                "p50_ms": round(statistics.median(values) * 1e3, 4),
            }
    path.write_text(json.dumps(out, indent=1) + "\n")


def main() -> int:
    argv = sys.argv[1:]
    profile_dir = os.environ.get(PROFILE_ENV)
    timings_dir = os.environ.get(TIMINGS_ENV)
    if argv[:1] == ["--timings"]:  # bench/dra.py's own pass over the pieces of a prepare
        timings_dir, argv = argv[1], argv[2:]
    if timings_dir:
        install_timings()
    from devplug_fake import main as fake_main

    profile = None
    if profile_dir:
        # What the driver imports on its way to its first API request, imported before the
        # profile starts: the profile shows the driver's work, not its imports.
        import importlib

        for name in PRELOADED:
            importlib.import_module(name)
        profile = cProfile.Profile()
        profile.enable()
    try:
        return fake_main(argv)
    finally:
        if profile is not None and profile_dir:
            profile.disable()
            Path(profile_dir).mkdir(parents=True, exist_ok=True)
            profile.dump_stats(Path(profile_dir) / f"driver-{os.getpid()}.prof")
        if timings_dir:
            Path(timings_dir).mkdir(parents=True, exist_ok=True)
            dump_timings(Path(timings_dir) / f"driver-{os.getpid()}.json")


if __name__ == "__main__":
    sys.exit(main())
