"""DRA prepare of shared devices (consumable capacity, KEP-5075), measured from the kubelet's side.

    python bench/dra_shares.py [--quick] [--out bench/results-dra-shares.json]

As in bench/dra.py, each driver is a separate ``devplug-fake --api dra`` process, each on a node
of its own; the API server (devplug.testing.FakeKubeAPI, real HTTP on 127.0.0.1) and the
kubelet's side (a blocking gRPC client in a thread, one call at a time) run in this process.
The kubelet roots (the checkpoints) are on this machine's disk, the CDI directories on tmpfs.

Each call is NodePrepareResources (v1) of a new one-device claim, created and allocated
beforehand with ``FakeKubeAPI.allocate_claim`` (untimed), so the driver GETs the claim, writes
its CDI spec and its checkpoint; then the claim's NodeUnprepareResources, which removes both;
then the claim is deleted (untimed). Both calls are timed. The variants:

- exclusive: ``--count 1``, the device given whole to the claim;
- shared, 1 share: ``--count 1 --shares 16``, each claim a new share of the device (a new
  ``shareID``, consuming ``shares: 1``), no other share prepared;
- shared, 16 shares: a second such driver on another node, 15 other claims' shares of its device
  prepared first and kept prepared, so the measured claim takes the 16th share; the driver
  weighs it against the 15 in its checkpoint, and the checkpoint it saves holds 16 claims;
- bare grpc.aio (bench/bare_dra.py): the same claim GET with lightkube and the same answer
  for the exclusive claim, no file written: the floor.

20 warm-up calls per variant, then the four are called in alternating blocks, so that a slow
spell of this shared machine falls on all of them. The breakdown times, in this process, the
checkpoint encoded and saved with the claims a driver holds while a measured claim is prepared
(1, and 16: the 16-share driver's own checkpoint file, which must still hold the 15 shares at
the end, and one more) and the share check against 15 others.
DEVPLUG_BENCH_PROFILE=DIR or DEVPLUG_BENCH_TIMINGS=DIR runs the three drivers through
bench/dra_driver.py, as for bench/dra.py. Prints JSON.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import core
import dra
import grpc

from devplug import Device
from devplug._dra.allocation import DeviceResult
from devplug._dra.checkpoint import FILE_NAME, KIND, VERSION, Checkpoint, _canonical, _digest, _fields
from devplug._dra.claims import _check_share
from devplug._proto.dra.v1 import api_pb2 as dra_pb
from devplug._proto.dra.v1 import api_pb2_grpc as dra_grpc
from devplug.models import CapacityRequestPolicy, ClaimRef
from devplug.testing import FakeKubeAPI

DRIVER = dra.DRIVER
NAMESPACE = "bench"
SHARES = 16
"""The shared drivers' ``--shares``: the device's capacity ``shares``, a claim taking 1."""
HELD = SHARES - 1
"""Other claims' shares kept prepared on the 16-share driver's device while it is measured."""
WARMUP = 20
BLOCKS = 5
FLOOR = "bare grpc.aio + lightkube GET, exclusive claim, no files (the floor)"


class Variant:
    """One kind of claim on one driver (node), called from a worker thread with a blocking client."""

    def __init__(  # noqa: PLR0917
        self,
        key: str,
        label: str,
        api: FakeKubeAPI,
        node: str,
        socket: Path,
        cdi: Path | None,
        shared: bool,
    ) -> None:
        self.key = key
        self.prefix = key.replace("_", "-")  # claim names are RFC 1123 subdomains
        self.label = label
        self.api = api
        self.node = node  # the claims are allocated from this node's pool
        self.cdi = cdi  # devplug's CDI directory: each prepare is checked to have written a spec
        self.shared = shared  # each answer is checked to name the claim's share
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub: Any = dra_grpc.DRAPluginStub(self.channel)
        self.calls = 0
        self.samples: dict[str, list[float]] = {"prepare": [], "unprepare": []}

    def _claim(self, name: str) -> tuple[str, str | None]:
        """Create and allocate a one-device claim on this node: its UID and share ID."""
        self.api.add_claim(NAMESPACE, name, requests=[("fake", 1)], device_class=DRIVER)
        claim = self.api.allocate_claim(NAMESPACE, name, node=self.node, driver=DRIVER, count=1)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        return str(claim["metadata"]["uid"]), result.get("shareID")

    def _spec(self, uid: str) -> Path | None:
        return self.cdi / f"k8s.{DRIVER}-claim_{uid}.json" if self.cdi else None

    def prepare(self, name: str) -> tuple[dra_pb.Claim, float]:
        """Allocate (untimed) and prepare a new claim ``name``: the claim and the prepare's time."""
        uid, share = anyio.from_thread.run_sync(self._claim, name)
        if self.shared and not share:
            raise RuntimeError(f"{self.label}: claim {name} was allocated no share")
        ref = dra_pb.Claim(namespace=NAMESPACE, name=name, uid=uid)
        request = dra_pb.NodePrepareResourcesRequest(claims=[ref])
        before = time.perf_counter()
        answer = self.stub.NodePrepareResources(request, timeout=45)
        took = time.perf_counter() - before
        entry = answer.claims[uid]
        if entry.error or len(entry.devices) != 1:
            raise RuntimeError(f"{self.label}: prepare of {name} failed: {entry}")
        if self.shared and entry.devices[0].share_id != share:
            raise RuntimeError(
                f"{self.label}: prepare of {name} answered share {entry.devices[0].share_id!r}"
            )
        spec = self._spec(uid)
        if spec is not None and not spec.exists():
            raise RuntimeError(f"{self.label}: no CDI spec {spec} after prepare")
        return ref, took

    def unprepare(self, ref: dra_pb.Claim) -> float:
        """Unprepare and delete (untimed) the claim: the unprepare's time."""
        request = dra_pb.NodeUnprepareResourcesRequest(claims=[ref])
        before = time.perf_counter()
        answer = self.stub.NodeUnprepareResources(request, timeout=45)
        took = time.perf_counter() - before
        if answer.claims[ref.uid].error:
            raise RuntimeError(f"{self.label}: unprepare of {ref.name} failed: {answer.claims[ref.uid]}")
        spec = self._spec(ref.uid)
        if spec is not None and spec.exists():
            raise RuntimeError(f"{self.label}: CDI spec {spec} left after unprepare")
        anyio.from_thread.run_sync(self.api.delete_claim, NAMESPACE, ref.name)
        return took

    def block(self, calls: int, *, record: bool = True) -> None:
        """``calls`` new claims, each prepared and unprepared."""
        for _ in range(calls):
            self.calls += 1
            ref, prepared = self.prepare(f"{self.prefix}-{self.calls}")
            unprepared = self.unprepare(ref)
            if record:
                self.samples["prepare"].append(prepared)
                self.samples["unprepare"].append(unprepared)

    def close(self) -> None:
        self.channel.close()


def hold(variant: Variant, count: int) -> None:
    """Prepare ``count`` claims' shares on the variant's device and keep them prepared."""
    for i in range(count):
        variant.prepare(f"{variant.prefix}-held-{i}")


def alternate(variants: list[Variant], calls: int, blocks: int = BLOCKS) -> int:
    """Warm-up, then ``blocks`` rounds of ``calls / blocks`` calls on each variant in turn; returns
    the number of blocks."""
    for variant in variants:
        variant.block(WARMUP, record=False)
    blocks = min(blocks, calls)
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for variant in variants:
            variant.block(per_block)
    return blocks


def shared_command(root: Path, kubeconfig: Path, cdi: Path, node: str, *extra: str) -> list[str]:
    """``devplug-fake --api dra --count 1`` on ``node`` (bench/dra.py's command, another node);
    through bench/dra_driver.py when DEVPLUG_BENCH_PROFILE or DEVPLUG_BENCH_TIMINGS is set."""
    dra.kubelet_root(root)
    hooked = any(os.environ.get(name) for name in dra.HOOK_ENVS)
    head = (
        [sys.executable, str(core.ROOT / "bench" / "dra_driver.py")]
        if hooked
        else [sys.executable, "-m", "devplug_fake"]
    )
    return [
        *head, "--api", "dra", "--driver-name", DRIVER,
        "--node-name", node, "--kubeconfig", str(kubeconfig), "--kubelet-root", str(root),
        "--cdi-dir", str(cdi), "--log-level", "warning", "--count", "1", *extra,
    ]  # fmt: skip


def pool(api: FakeKubeAPI, node: str) -> list[dict[str, Any]]:
    """The devices of the node's pool (one slice per pool here)."""
    return [d for s in api.slices(node=node, driver=DRIVER) for d in s["spec"].get("devices") or ()]


def published(api: FakeKubeAPI, node: str) -> bool:
    """The node's one device is published."""
    return len(pool(api, node)) == 1


async def bench(workdir: Path, calls: int, breakdown_runs: int) -> dict[str, Any]:
    """The four variants side by side; the checkpoint the 16-share driver held, for the breakdown."""
    cdi = dra.cdi_root()
    nodes = {"exclusive": "node-excl", "shared_1": "node-share-1", "shared_16": "node-share-16"}
    roots = {key: workdir / f"shares-{key}" for key in nodes}
    held_checkpoint = workdir / "shares-held-checkpoint.json"
    try:
        async with FakeKubeAPI() as api:
            for node in nodes.values():
                api.add_node(node)
            kubeconfig = api.write_kubeconfig(workdir / "shares-kubeconfig")
            bare_socket = workdir / "shares-bare-dra.sock"
            share = ("--shares", str(SHARES))
            commands = [
                shared_command(
                    roots[key], kubeconfig, cdi / key, node, *(share if key != "exclusive" else ())
                )
                for key, node in nodes.items()
            ]
            bare = [
                sys.executable,
                str(core.ROOT / "bench" / "bare_dra.py"),
                str(bare_socket),
                str(kubeconfig),
                DRIVER,
            ]
            async with (
                core.started(commands[0]),
                core.started(commands[1]),
                core.started(commands[2]),
                core.started(bare),
            ):
                for key, node in nodes.items():
                    await api.wait_for(functools.partial(published, api, node), timeout=60)
                    (device,) = pool(api, node)
                    if bool(device.get("allowMultipleAllocations")) != (key != "exclusive"):
                        raise RuntimeError(f"{key}: device published as {device}")
                    await dra.register(roots[key] / "plugins_registry" / f"{DRIVER}-reg.sock")
                await dra.wait_for_socket(bare_socket)
                variants = [
                    Variant(
                        "exclusive", "exclusive device", api, nodes["exclusive"],
                        dra.dra_socket(roots["exclusive"]), cdi / "exclusive", shared=False,
                    ),
                    Variant(
                        "shared_1", "shared device, 1 share prepared", api, nodes["shared_1"],
                        dra.dra_socket(roots["shared_1"]), cdi / "shared_1", shared=True,
                    ),
                    Variant(
                        "shared_16", f"shared device, {SHARES} shares prepared", api, nodes["shared_16"],
                        dra.dra_socket(roots["shared_16"]), cdi / "shared_16", shared=True,
                    ),
                    Variant(
                        "bare_grpc_aio", FLOOR, api, nodes["exclusive"], bare_socket, None, shared=False,
                    ),
                ]  # fmt: skip
                try:
                    await anyio.to_thread.run_sync(hold, variants[2], HELD)
                    blocks = await anyio.to_thread.run_sync(alternate, variants, calls)
                    checkpoint = dra.dra_socket(roots["shared_16"]).parent / "state" / FILE_NAME
                    shutil.copyfile(checkpoint, held_checkpoint)
                finally:
                    for variant in variants:
                        variant.close()
    finally:
        shutil.rmtree(cdi, ignore_errors=True)
    figures: dict[str, Any] = {
        "shares": SHARES,
        "held": HELD,
        "calls": calls,
        "blocks": blocks,
        "warmup": WARMUP,
        "checkpoint_filesystem": dra.filesystem(workdir),
        "cdi_filesystem": dra.filesystem(cdi.parent),
        "variants": {
            v.key: {"label": v.label, **{m: core.summary(s) for m, s in v.samples.items()}} for v in variants
        },
    }
    exclusive = figures["variants"]["exclusive"]
    figures["ratio_p50_to_exclusive"] = {
        key: {m: round(v[m]["p50"] / exclusive[m]["p50"], 2) for m in ("prepare", "unprepare")}
        for key, v in figures["variants"].items()
        if key != "exclusive"
    }
    figures["breakdown"] = breakdown(workdir, held_checkpoint, breakdown_runs)
    return figures


def encode(checkpoint: Checkpoint) -> str:
    """The checkpoint's text, as Checkpoint.save encodes it before writing it (every claim it
    holds, each time)."""
    body = {
        "kind": KIND,
        "version": VERSION,
        "driver": checkpoint.driver,
        "node": checkpoint.node,
        "claims": {uid: _fields(claim) for uid, claim in sorted(checkpoint.claims.items())},
    }
    canonical = _canonical(body)
    return f'{canonical[:-1]},"checksum":"{_digest(canonical)}"}}'


def breakdown(workdir: Path, held: Path, runs: int) -> dict[str, Any]:
    """In this process (ms, p50 of ``runs``): the checkpoint as a driver saves it while a measured
    claim is prepared, with 1 claim and with 16 (the 15 held shares of ``held``, the driver's own
    file, and one more), encoded alone and saved whole (the two sizes in turn, run by run); its
    size; and the share check of a new share against 15 others (µs)."""
    source = Checkpoint(held, DRIVER, "node-share-16")
    source.load()
    if source.error or len(source.claims) != HELD:
        raise RuntimeError(
            f"the 16-share driver's checkpoint holds {len(source.claims)} claims: {source.error}"
        )
    claims = list(source.claims.values())
    measured = replace(claims[0], uid=f"{claims[0].uid}-measured")
    checkpoints = {}
    for count in (1, SHARES):
        checkpoint = Checkpoint(workdir / f"shares-bd-{count}" / FILE_NAME, DRIVER, "node-share-16")
        checkpoint.path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.claims = {c.uid: c for c in [*claims[: count - 1], measured]}
        checkpoints[count] = checkpoint
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        for count, checkpoint in checkpoints.items():
            for step, work in (("encode", encode), ("save", Checkpoint.save)):
                before = time.perf_counter()
                work(checkpoint)
                samples.setdefault(f"checkpoint_{step}_{count}_claims", []).append(
                    time.perf_counter() - before
                )
    steps: dict[str, Any] = {name: core.summary(values)["p50"] for name, values in samples.items()}
    for count, checkpoint in checkpoints.items():
        steps[f"checkpoint_bytes_{count}_claims"] = checkpoint.path.stat().st_size
    device = Device(
        id="fake-0",
        capacity={"shares": str(SHARES)},
        allow_multiple_allocations=True,
        request_policies={"shares": CapacityRequestPolicy(default="1", min="1", step="1")},
    )
    others = [(c, d) for c in claims for d in c.devices]
    result = DeviceResult(
        request="fake",
        driver=DRIVER,
        pool="node-share-16",
        device="fake-0",
        share_id="new-share",
        consumed_capacity={"shares": "1"},
    )
    ref = ClaimRef(NAMESPACE, "measured", "uid-measured")
    checks = []
    for _ in range(runs):
        before = time.perf_counter()
        _check_share(ref, device, "fake-0", result, others)
        checks.append(time.perf_counter() - before)
    steps[f"share_check_{HELD}_others_us"] = core.summary(checks, "us")["p50"]
    return {"unit": "ms", "runs": runs, **steps}


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        return {
            "machine": dra.machine_info(),
            "dra_shares": await bench(workdir, 60 if quick else 300, 50 if quick else 200),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
