"""DRA driver benchmarks, measured from the kubelet's side of the socket.

    python bench/dra.py [--quick] [--out bench/results-dra.json]

As on a node, the driver is a separate ``devplug-fake --api dra`` process; the API server
(devplug.testing.FakeKubeAPI, real HTTP on 127.0.0.1) and the kubelet's side (raw gRPC clients)
run in this process. The driver's kubelet root (its checkpoint) is on this machine's disk, as
/var/lib/kubelet is; its CDI directory is on tmpfs (/dev/shm) when there is one, as /var/run/cdi
is on a node.

- Prepare: NodePrepareResources (v1) for one claim of 1 or 8 devices, each call a new claim
  allocated beforehand with ``FakeKubeAPI.allocate_claim`` (so every call reads the claim from
  the API server, writes a CDI spec and the checkpoint), then its NodeUnprepareResources, both
  timed, from a blocking gRPC client in a thread, one call at a time. The same client calls
  bench/bare_dra.py, a bare grpc.aio DRAPlugin doing the same claim GET with lightkube and
  answering the same shape without writing files: the floor. The two are measured in
  alternating blocks, so that a slow spell of this shared machine falls on both.
- Publication: process start → every ResourceSlice of the pool in FakeKubeAPI and complete
  (``resourceSliceCount`` slices of the highest generation holding all devices), for
  ``--count`` 1,000 and 10,000; and the driver's first API request → complete (its imports and
  set-up left out). CPU time of the driver and of this process (the API server) over the run.
- Wipe: 1,000 devices published, ``FakeKubeAPI.wipe_slices(node)`` (a kubelet start), then the
  time until the pool is complete again.
- Health: a NodeWatchResources (v1alpha1) stream open on the DRA socket, read by a blocking
  client in a thread; a device's health flipped through ``--state-file`` (atomic rename); the
  time until the stream delivers it.

Set DEVPLUG_BENCH_PROFILE=DIR (cProfile) or DEVPLUG_BENCH_TIMINGS=DIR (wall time of the driver's
pieces) to run every driver through bench/dra_driver.py, which writes one file per driver there.
Prints JSON.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import core
import grpc

from devplug._cdi_files import write_atomically
from devplug._dra.allocation import PreparedEntry
from devplug._dra.checkpoint import Checkpoint, PreparedClaim
from devplug._proto.dra.v1 import api_pb2 as dra_pb
from devplug._proto.dra.v1 import api_pb2_grpc as dra_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.testing import FakeKubeAPI

if TYPE_CHECKING:
    from devplug.testing._kubeapi.httpserver import Request, Response, StreamResponse

DRIVER = "fake.example.com"
NODE = "node-1"
NAMESPACE = "bench"
HOOK_ENVS = ("DEVPLUG_BENCH_PROFILE", "DEVPLUG_BENCH_TIMINGS")  # see bench/dra_driver.py
SHAPES = (1, 8)  # devices per claim
WARMUP = 20  # untimed calls per shape and handler before the timed ones
HEALTHY, UNHEALTHY = 1, 2  # v1alpha1.HealthStatus


class TimedKubeAPI(FakeKubeAPI):
    """FakeKubeAPI noting when its first request arrived: the driver's first API call, made once
    its imports and set-up are done."""

    first_request_at: float | None = None

    async def _handle(self, request: Request) -> Response | StreamResponse:
        if self.first_request_at is None:
            self.first_request_at = time.monotonic()
        return await super()._handle(request)


def machine_info() -> dict[str, Any]:
    from importlib.metadata import version

    info = core.machine_info()
    info["lightkube"] = version("lightkube")
    return info


def filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` lies on (ext4, tmpfs, ...), from /proc/mounts."""
    target = str(path.resolve())
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1]
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def cdi_root() -> Path:
    """A tmpfs directory for CDI specs, as /var/run/cdi is on a node (else the temporary directory)."""
    shm = Path("/dev/shm")  # noqa: S108 - a private directory is made in it
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="dpb-cdi-", dir=base))


def kubelet_root(root: Path) -> Path:
    """``root`` with the plugin watcher's ``plugins_registry`` in it, made as the kubelet makes it
    (a driver waits for that directory and never creates it)."""
    (root / "plugins_registry").mkdir(parents=True, exist_ok=True)
    return root


def driver_command(
    root: Path, kubeconfig: Path, cdi_dir: Path, *extra: str, timings: Path | None = None
) -> list[str]:
    """``devplug-fake --api dra``; through bench/dra_driver.py when its pieces are timed or profiled."""
    kubelet_root(root)
    args = [
        "--api", "dra", "--driver-name", DRIVER, "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--kubelet-root", str(root), "--cdi-dir", str(cdi_dir),
        "--log-level", "warning", *extra,
    ]  # fmt: skip
    hook = [sys.executable, str(core.ROOT / "bench" / "dra_driver.py")]
    if timings is not None:
        return [*hook, "--timings", str(timings), *args]
    if any(os.environ.get(name) for name in HOOK_ENVS):
        return [*hook, *args]
    return [sys.executable, "-m", "devplug_fake", *args]


def dra_socket(root: Path) -> Path:
    return root / "plugins" / DRIVER / "dra.sock"


def pool_complete(api: FakeKubeAPI, devices: int) -> bool:
    """The node's pool is complete: ``resourceSliceCount`` slices at its highest generation, holding
    all ``devices`` devices. Reads the store in place (no copies: this runs after every write,
    in the process that also serves the API)."""
    slices = [
        s["spec"]
        for s in api._store.objects["resourceslices"].values()  # a cheap read: this runs after every write
        if s["spec"].get("nodeName") == NODE and s["spec"].get("driver") == DRIVER
    ]
    if not slices:
        return False
    top = max(s["pool"]["generation"] for s in slices)
    current = [s for s in slices if s["pool"]["generation"] == top]
    if {s["pool"]["resourceSliceCount"] for s in current} != {len(current)}:
        return False
    names = {d["name"] for s in current for d in s.get("devices") or ()}
    return len(names) == devices


async def wait_complete(api: FakeKubeAPI, devices: int, timeout: float) -> float:  # noqa: ASYNC109
    """Wait until the pool is complete; returns the monotonic time it was first seen so (checked
    after every write the API server takes)."""
    seen: list[float] = []

    def done() -> bool:
        if pool_complete(api, devices):
            seen.append(time.monotonic())
            return True
        return False

    await api.wait_for(done, timeout)
    return seen[0]


async def register(registration_socket: Path) -> None:
    """What the kubelet's plugin watcher does: GetInfo, then NotifyRegistrationStatus(true)."""
    with anyio.fail_after(30):
        while not await anyio.Path(registration_socket).exists():  # noqa: ASYNC110 - another process
            await anyio.sleep(0.01)
    async with grpc.aio.insecure_channel(f"unix://{registration_socket}") as channel:
        stub: Any = reg_grpc.RegistrationStub(channel)
        await stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
        await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=5)


async def wait_for_socket(path: Path) -> None:
    with anyio.fail_after(30):
        while not await anyio.Path(path).exists():  # noqa: ASYNC110 - another process creates it
            await anyio.sleep(0.01)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- 1. NodePrepareResources / NodeUnprepareResources ---------------------------------------------


class Target:
    """One DRAPlugin under test, called from a worker thread with a blocking client."""

    def __init__(self, label: str, socket: Path, api: FakeKubeAPI, spec_dir: Path | None) -> None:
        self.label = label
        self.api = api
        self.spec_dir = spec_dir  # devplug's CDI directory: each prepare is checked to have written
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub: Any = dra_grpc.DRAPluginStub(self.channel)
        self.calls = 0
        self.samples: dict[str, list[float]] = {}

    def _claim(self, name: str, devices: int) -> str:
        self.api.add_claim(NAMESPACE, name, requests=[("fake", devices)], device_class=DRIVER)
        claim = self.api.allocate_claim(NAMESPACE, name, node=NODE, driver=DRIVER, count=devices)
        return str(claim["metadata"]["uid"])

    def block(self, devices: int, calls: int, *, record: bool = True) -> None:
        """``calls`` claims of ``devices`` devices: allocate (untimed), prepare, unprepare, delete."""
        prepare = self.samples.setdefault(f"prepare_{devices}", [])
        unprepare = self.samples.setdefault(f"unprepare_{devices}", [])
        for _ in range(calls):
            self.calls += 1
            name = f"{self.label}-{self.calls}"
            uid = anyio.from_thread.run_sync(self._claim, name, devices)
            claims = [dra_pb.Claim(namespace=NAMESPACE, name=name, uid=uid)]
            request = dra_pb.NodePrepareResourcesRequest(claims=claims)
            before = time.perf_counter()
            answer = self.stub.NodePrepareResources(request, timeout=45)
            prepared = time.perf_counter()
            entry = answer.claims[uid]
            if entry.error or len(entry.devices) != devices:
                raise RuntimeError(f"{self.label}: prepare of {name} failed: {entry}")
            spec = self.spec_dir / f"k8s.{DRIVER}-claim_{uid}.json" if self.spec_dir else None
            if spec is not None and not spec.exists():
                raise RuntimeError(f"{self.label}: no CDI spec {spec} after prepare")
            request_u = dra_pb.NodeUnprepareResourcesRequest(claims=claims)
            before_u = time.perf_counter()
            answer_u = self.stub.NodeUnprepareResources(request_u, timeout=45)
            unprepared = time.perf_counter()
            if answer_u.claims[uid].error:
                raise RuntimeError(f"{self.label}: unprepare of {name} failed: {answer_u.claims[uid]}")
            if spec is not None and spec.exists():
                raise RuntimeError(f"{self.label}: CDI spec {spec} left after unprepare")
            anyio.from_thread.run_sync(self.api.delete_claim, NAMESPACE, name)
            if record:
                prepare.append(prepared - before)
                unprepare.append(unprepared - before_u)

    def close(self) -> None:
        self.channel.close()


def alternate(targets: list[Target], calls: int, blocks: int = 5) -> None:
    """Warm-up, then ``blocks`` rounds, each ``calls / blocks`` calls per shape on each target in turn."""
    for target in targets:
        for devices in SHAPES:
            target.block(devices, WARMUP, record=False)
    blocks = min(blocks, calls)
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for target in targets:
            for devices in SHAPES:
                target.block(devices, per_block)


async def bench_prepare(workdir: Path, calls: int, piece_calls: int) -> dict[str, Any]:
    """The round trips of devplug and the floor; then, apart, the pieces of devplug's prepare."""
    root = workdir / "prep"
    cdi = cdi_root()
    pieces_dir = workdir / "prep-pieces"
    try:
        async with TimedKubeAPI() as api:
            api.add_node(NODE)
            kubeconfig = api.write_kubeconfig(workdir / "prep-kubeconfig")
            bare_socket = workdir / "bare-dra.sock"
            command = driver_command(root, kubeconfig, cdi, "--count", "8")
            bare = [
                sys.executable,
                str(core.ROOT / "bench" / "bare_dra.py"),
                str(bare_socket),
                str(kubeconfig),
                DRIVER,
            ]
            async with core.started(command), core.started(bare):
                await wait_complete(api, 8, timeout=60)
                await register(root / "plugins_registry" / f"{DRIVER}-reg.sock")
                await wait_for_socket(bare_socket)
                targets = [
                    Target("devplug", dra_socket(root), api, cdi),
                    Target("bare", bare_socket, api, None),
                ]
                try:
                    await anyio.to_thread.run_sync(alternate, targets, calls)
                finally:
                    for target in targets:
                        target.close()
            # The pieces: another driver, some of its functions timed (bench/dra_driver.py).
            timed_root = workdir / "prep-timed"
            command = driver_command(timed_root, kubeconfig, cdi, "--count", "8", timings=pieces_dir)
            async with core.started(command):
                await register(timed_root / "plugins_registry" / f"{DRIVER}-reg.sock")
                timed = Target("timed", dra_socket(timed_root), api, cdi)
                try:
                    await anyio.to_thread.run_sync(alternate, [timed], piece_calls, 1)
                finally:
                    timed.close()
        (pieces_file,) = pieces_dir.glob("driver-*.json")
        pieces = json.loads(pieces_file.read_text())
    finally:
        shutil.rmtree(cdi, ignore_errors=True)
    figures: dict[str, Any] = {
        "checkpoint_filesystem": filesystem(workdir),
        "cdi_filesystem": filesystem(cdi.parent),
    }
    for target, key in zip(targets, ("devplug", "bare_grpc_aio"), strict=True):
        figures[key] = {name: core.summary(samples) for name, samples in target.samples.items()}
    figures["ratio_p50"] = {
        name: round(figures["devplug"][name]["p50"] / figures["bare_grpc_aio"][name]["p50"], 2)
        for name in figures["devplug"]
    }
    figures["devplug_pieces"] = {
        "note": "wall time inside the driver, p50 over 1- and 8-device claims together, ms",
        "calls": timed.calls - WARMUP * len(SHAPES),
        **{
            f"round_trip_{method}": core.summary(
                [x for count in SHAPES for x in timed.samples[f"{method}_{count}"]]
            )["p50"]
            for method in ("prepare", "unprepare")
        },
        **{name: piece["p50_ms"] for name, piece in pieces.items() if not name.startswith("reconcile")},
    }
    return figures


# -- 2. Publication -------------------------------------------------------------------------------


async def publish_once(workdir: Path, devices: int, run: int) -> dict[str, float]:
    root = workdir / f"pub-{devices}-{run}"
    cdi = workdir / f"pub-cdi-{devices}-{run}"
    async with TimedKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(workdir / f"pub-kubeconfig-{devices}-{run}")
        command = driver_command(root, kubeconfig, cdi, "--count", str(devices))
        own_cpu = time.process_time()
        began = time.monotonic()
        async with core.started(command) as process:
            done = await wait_complete(api, devices, timeout=120)
            driver_cpu = cpu_seconds(process.pid)
            api_cpu = time.process_time() - own_cpu
            slices = len(api.slices(node=NODE, driver=DRIVER))
            await anyio.sleep(0.5)  # let the watch deliver the last events before the driver stops
        assert api.first_request_at is not None
        return {
            "start_to_complete": done - began,
            "start_to_first_request": api.first_request_at - began,
            "first_request_to_complete": done - api.first_request_at,
            "driver_cpu": driver_cpu,
            "api_server_cpu": api_cpu,
            "slices": slices,
        }


IMPORTS = (
    "devplug_fake",
    "devplug._dra.driver",
    "lightkube",
    "lightkube.resources.core_v1",
    "lightkube.resources.resource_v1",
)


async def import_times(runs: int) -> dict[str, Any]:
    """Wall time of a bare interpreter, and of one importing what the driver imports before its
    first API request (the process start of the publication figures, without the driver)."""
    out = {}
    for key, code in (("python_start", "pass"), ("python_and_imports", "import " + ", ".join(IMPORTS))):
        samples = []
        for _ in range(runs):
            before = time.monotonic()
            await anyio.run_process([sys.executable, "-c", code])
            samples.append(time.monotonic() - before)
        out[key] = core.summary(samples)
    return out


async def bench_publication(workdir: Path, runs: dict[int, int]) -> dict[str, Any]:
    results: dict[str, Any] = {"imports": await import_times(max(runs.values()) + 2)}
    for devices, n_runs in runs.items():
        samples = [await publish_once(workdir, devices, i) for i in range(n_runs)]
        results[f"devices_{devices}"] = {
            "devices": devices,
            "slices": samples[0]["slices"],
            **{
                key: core.summary([s[key] for s in samples])
                for key in (
                    "start_to_complete",
                    "start_to_first_request",
                    "first_request_to_complete",
                    "driver_cpu",
                    "api_server_cpu",
                )
            },
        }
    return results


# -- 3. Slices back after a wipe ------------------------------------------------------------------


async def bench_wipes(workdir: Path, wipes: int, devices: int = 1000) -> dict[str, Any]:
    root = workdir / "wipe"
    async with TimedKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(workdir / "wipe-kubeconfig")
        async with core.started(
            driver_command(root, kubeconfig, workdir / "wipe-cdi", "--count", str(devices))
        ):
            await wait_complete(api, devices, timeout=120)
            await anyio.sleep(0.5)  # the publisher's confirming reconcile
            samples, generations, writes = [], [], Counter[str]()
            for _ in range(wipes):
                generation = api.slices(node=NODE)[0]["spec"]["pool"]["generation"]
                seen = len(api.requests)
                wiped = api.wipe_slices(NODE)
                began = time.monotonic()
                assert wiped
                assert not pool_complete(api, devices)
                done = await wait_complete(api, devices, timeout=30)
                samples.append(done - began)
                generations.append(api.slices(node=NODE)[0]["spec"]["pool"]["generation"] - generation)
                await anyio.sleep(0.3)  # the driver settles; its writes until then count for this wipe
                writes.update(
                    f"{r.verb} {r.status}"
                    for r in api.requests[seen:]
                    if r.verb in ("create", "update", "patch", "delete")
                )
    return {
        "devices": devices,
        "slices": wiped,
        "wipe_to_complete": core.summary(samples),
        "generations_per_wipe": round(sum(generations) / len(generations), 2),
        "writes_per_wipe": {k: round(v / len(samples), 2) for k, v in sorted(writes.items())},
    }


# -- 4. Health change → health stream -------------------------------------------------------------


def state_text(unhealthy: bool, count: int = 8) -> str:
    devices = [
        {"id": f"fake-{i}", "health": "Unhealthy" if unhealthy and i == 0 else "Healthy"}
        for i in range(count)
    ]
    return json.dumps({"devices": devices})


def write_state(path: Path, unhealthy: bool) -> float:
    """Write the state file atomically; returns the perf_counter time just before the rename
    (the moment the driver can see it: the clock of a health flip starts there)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state_text(unhealthy))
    renamed = time.perf_counter()
    os.replace(tmp, path)
    return renamed


def health_flips(socket: Path, state: Path, flips: int, pause: float) -> list[float]:
    """In a worker thread: the stream read by a blocking client, the state file flipped ``flips`` times."""
    received: queue.Queue[tuple[float, int | None]] = queue.Queue()
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub: Any = health_grpc.DRAResourceHealthStub(channel)
        stream = stub.NodeWatchResources(health_pb.NodeWatchResourcesRequest())

        def reader() -> None:
            try:
                for message in stream:
                    at = time.perf_counter()
                    health = {d.device.device_name: d.health for d in message.devices}
                    received.put((at, health.get("fake-0")))
            except grpc.RpcError:
                pass  # cancelled at the end

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            _, first = received.get(timeout=30)
            if first != HEALTHY:
                raise RuntimeError(f"first health message: fake-0 is {first}")
            samples = []
            for i in range(flips):
                unhealthy = i % 2 == 0
                want = UNHEALTHY if unhealthy else HEALTHY
                written = write_state(state, unhealthy)
                while True:
                    at, health = received.get(timeout=10)
                    if health == want:
                        break
                samples.append(at - written)
                time.sleep(pause)
        finally:
            stream.cancel()
            thread.join(5)
    return samples


async def bench_health(workdir: Path, flips: int) -> dict[str, Any]:
    root = workdir / "health"
    state = workdir / "health-state.json"
    write_state(state, False)
    async with TimedKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(workdir / "health-kubeconfig")
        command = driver_command(root, kubeconfig, workdir / "health-cdi", "--state-file", str(state))
        async with core.started(command):
            await wait_complete(api, 8, timeout=60)
            await register(root / "plugins_registry" / f"{DRIVER}-reg.sock")
            samples = await anyio.to_thread.run_sync(health_flips, dra_socket(root), state, flips, 0.05)
    return {"health_change_to_stream": core.summary(samples)}


# -- pieces, timed in this process ----------------------------------------------------------------


async def breakdown(workdir: Path, runs: int = 200) -> dict[str, Any]:
    """What the pieces of a prepare cost on their own here (ms, p50 of ``runs``): the file writes on
    the filesystems the benchmark uses, and one claim GET with lightkube against FakeKubeAPI with
    client and server in one process."""
    cdi = cdi_root()
    steps: dict[str, Any] = {}
    try:

        def timed(name: str, func: Any) -> None:
            samples = []
            for _ in range(runs):
                before = time.perf_counter()
                func()
                samples.append(time.perf_counter() - before)
            steps[name] = core.summary(samples)["p50"]

        spec = json.dumps({"cdiVersion": "0.6.0", "kind": f"k8s.{DRIVER}/claim", "devices": []})
        timed("cdi_spec_write_tmpfs", lambda: write_atomically(cdi, "spec.json", spec))
        timed("cdi_spec_write_disk", lambda: write_atomically(workdir / "cdi-disk", "spec.json", spec))
        checkpoint = Checkpoint(workdir / "bd" / "checkpoint.json", DRIVER, NODE)
        checkpoint.claims["u"] = PreparedClaim(
            "u", NAMESPACE, "c", devices=[PreparedEntry(device=f"fake-{i}", pool=NODE) for i in range(8)]
        )
        timed("checkpoint_save_disk", checkpoint.save)
        from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

        async with FakeKubeAPI() as api:
            api.add_node(NODE)
            client = api.client()
            slice_spec = {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"fake-{i}"} for i in range(8)],
            }
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
            await client.create(ResourceSlice.from_dict({**body, "spec": slice_spec}))
            api.add_claim(NAMESPACE, "c", requests=[("fake", 8)], device_class=DRIVER)
            api.allocate_claim(NAMESPACE, "c", node=NODE, driver=DRIVER, count=8)
            samples = []
            for _ in range(runs):
                before = time.perf_counter()
                await client.get(ResourceClaim, "c", namespace=NAMESPACE)
                samples.append(time.perf_counter() - before)
            await client.close()
            steps["claim_get_in_one_process"] = core.summary(samples)["p50"]
    finally:
        shutil.rmtree(cdi, ignore_errors=True)
    return {"unit": "ms", "runs": runs, **steps}


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        return {
            "machine": machine_info(),
            "prepare": await bench_prepare(workdir, 100 if quick else 400, 40 if quick else 150),
            "publication": await bench_publication(
                workdir, {1000: 1, 10_000: 1} if quick else {1000: 5, 10_000: 3}
            ),
            "wipes": await bench_wipes(workdir, 5 if quick else 30),
            "health": await bench_health(workdir, 30 if quick else 200),
            "breakdown": await breakdown(workdir, 50 if quick else 200),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
