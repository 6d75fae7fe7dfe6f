"""devplug-nvidia's DRA prepare, measured from the kubelet's side of the socket, beside devplug-fake's.

    python bench/nvidia_dra.py [--quick] [--out FILE]

The drivers are separate processes, as on a node: ``devplug-nvidia --api dra --fake-nvml MODEL``
for the fake machines dgx-a100 (8 x A100 SXM4) and mig-mixed (5 x A100 with MIG devices; the
model's /sys, /proc and /dev tree laid out by the driver itself), and ``devplug-fake --api dra
--count 8``. The API server (devplug.testing.FakeKubeAPI, real HTTP on 127.0.0.1) and the
kubelet's side (a blocking gRPC client in a thread) run in this process.

Each call is NodePrepareResources (v1) of a new claim, created and allocated beforehand with
``FakeKubeAPI.allocate_claim`` for the named devices (untimed), so the driver GETs the claim,
builds and writes its CDI spec (NVIDIA's transient YAML spec; for a MIG device the capability
files under the model's /proc are read) and saves its checkpoint; then the claim's
NodeUnprepareResources, which removes both; then the claim is deleted (untimed). The shapes:
1 GPU and 8 GPUs on dgx-a100, one MIG device and one GPU on mig-mixed, and devplug-fake's 1 and
8 devices. 20 warm-up calls per shape; then the drivers are called in alternating blocks, so
that a slow spell of this shared machine falls on all of them.

Set DEVPLUG_BENCH_PROFILE=DIR to run the NVIDIA drivers under cProfile (``python -m cProfile``,
one DIR/nvidia-<model>.prof each, written when the driver exits on SIGTERM). Prints JSON.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import core
import dra
import grpc

from devplug._proto.dra.v1 import api_pb2 as dra_pb
from devplug._proto.dra.v1 import api_pb2_grpc as dra_grpc
from devplug.testing import FakeKubeAPI

if TYPE_CHECKING:
    from collections.abc import Callable

NVIDIA_DRIVER = "gpu.nvidia.com"
FAKE_DRIVER = dra.DRIVER
NODE = dra.NODE
NAMESPACE = "bench"
WARMUP = 20
PROFILE_ENV = "DEVPLUG_BENCH_PROFILE"
TARGET_P50_MS = 5.0
MODELS = {"dgx-a100": 8, "mig-mixed": 15}
"""The fake machines and the number of devices devplug-nvidia publishes for each."""


class Shape:
    """One kind of claim on one driver and node: which devices it names (or how many, for the fake)."""

    def __init__(self, key: str, label: str, driver: str, node: str, devices: list[str] | int) -> None:
        self.key = key
        self.label = label
        self.driver = driver
        self.node = node
        self.devices = devices

    @property
    def count(self) -> int:
        return self.devices if isinstance(self.devices, int) else len(self.devices)


class Target:
    """One driver under test, called from a worker thread with a blocking client."""

    def __init__(self, name: str, socket: Path, api: FakeKubeAPI, cdi: Path, shapes: list[Shape]) -> None:
        self.name = name
        self.api = api
        self.cdi = cdi
        self.shapes = shapes
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub: Any = dra_grpc.DRAPluginStub(self.channel)
        self.calls = 0
        self.samples: dict[str, dict[str, list[float]]] = {}

    def _claim(self, name: str, shape: Shape) -> str:
        if isinstance(shape.devices, int):
            self.api.add_claim(NAMESPACE, name, requests=[("dev", shape.devices)], device_class=shape.driver)
        else:
            self.api.add_claim(
                NAMESPACE, name, requests=[("gpu", list(shape.devices))], device_class=shape.driver
            )
        claim = self.api.allocate_claim(NAMESPACE, name, node=shape.node, driver=shape.driver)
        return str(claim["metadata"]["uid"])

    def _spec(self, shape: Shape, uid: str) -> Path:
        suffix = "yaml" if shape.driver == NVIDIA_DRIVER else "json"
        return self.cdi / f"k8s.{shape.driver}-claim_{uid}.{suffix}"

    def block(self, shape: Shape, calls: int, *, record: bool = True) -> None:
        """``calls`` claims of ``shape``: allocate (untimed), prepare, unprepare, delete (untimed)."""
        samples = self.samples.setdefault(shape.key, {"prepare": [], "unprepare": []})
        for _ in range(calls):
            self.calls += 1
            name = f"{self.name}-{self.calls}"
            uid = anyio.from_thread.run_sync(self._claim, name, shape)
            claims = [dra_pb.Claim(namespace=NAMESPACE, name=name, uid=uid)]
            before = time.perf_counter()
            answer = self.stub.NodePrepareResources(
                dra_pb.NodePrepareResourcesRequest(claims=claims), timeout=45
            )
            prepared = time.perf_counter()
            entry = answer.claims[uid]
            if entry.error or len(entry.devices) != shape.count:
                raise RuntimeError(f"{self.name}: prepare of {name} ({shape.label}) failed: {entry}")
            spec = self._spec(shape, uid)
            if not spec.exists():
                raise RuntimeError(f"{self.name}: no CDI spec {spec} after prepare")
            before_u = time.perf_counter()
            answer_u = self.stub.NodeUnprepareResources(
                dra_pb.NodeUnprepareResourcesRequest(claims=claims), timeout=45
            )
            unprepared = time.perf_counter()
            if answer_u.claims[uid].error:
                raise RuntimeError(f"{self.name}: unprepare of {name} failed: {answer_u.claims[uid]}")
            if spec.exists():
                raise RuntimeError(f"{self.name}: CDI spec {spec} left after unprepare")
            anyio.from_thread.run_sync(self.api.delete_claim, NAMESPACE, name)
            if record:
                samples["prepare"].append(prepared - before)
                samples["unprepare"].append(unprepared - before_u)

    def close(self) -> None:
        self.channel.close()


def alternate(targets: list[Target], calls: int, blocks: int = 5) -> None:
    """Warm-up, then ``blocks`` rounds of ``calls / blocks`` calls per shape on each target in turn."""
    for target in targets:
        for shape in target.shapes:
            target.block(shape, WARMUP, record=False)
    blocks = min(blocks, calls)
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for target in targets:
            for shape in target.shapes:
                target.block(shape, per_block)


def nvidia_command(model: str, root: Path, kubeconfig: Path, cdi: Path) -> list[str]:
    """``devplug-nvidia --api dra`` on the fake machine ``model`` (node ``model``); under
    cProfile when asked."""
    dra.kubelet_root(root)
    args = [
        "--api", "dra", "--fake-nvml", model, "--node-name", model, "--kubeconfig", str(kubeconfig),
        "--kubelet-root", str(root), "--cdi-dir", str(cdi), "--log-level", "warning",
    ]  # fmt: skip
    profile = os.environ.get(PROFILE_ENV)
    if profile:
        Path(profile).mkdir(parents=True, exist_ok=True)
        out = Path(profile) / f"nvidia-{model}.prof"
        return [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "devplug_nvidia", *args]
    return [sys.executable, "-m", "devplug_nvidia", *args]


def fake_command(root: Path, kubeconfig: Path, cdi: Path) -> list[str]:
    dra.kubelet_root(root)
    return [
        sys.executable, "-m", "devplug_fake", "--api", "dra", "--driver-name", FAKE_DRIVER,
        "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--kubelet-root", str(root),
        "--cdi-dir", str(cdi), "--log-level", "warning", "--count", "8",
    ]  # fmt: skip


def pool(api: FakeKubeAPI, node: str, driver: str) -> list[str]:
    """The device names of the node's pool for ``driver`` (one slice per pool here)."""
    return [d["name"] for s in api.slices(node=node, driver=driver) for d in s["spec"].get("devices") or ()]


async def wait_pool(api: FakeKubeAPI, node: str, driver: str, devices: int) -> list[str]:
    await api.wait_for(lambda: len(pool(api, node, driver)) == devices, timeout=60)
    return pool(api, node, driver)


def nvidia_shapes(model: str, names: list[str]) -> list[Shape]:
    gpus = [n for n in names if "-mig-" not in n]
    if model == "dgx-a100":
        return [
            Shape("dgx_a100_1_gpu", "dgx-a100, 1 GPU", NVIDIA_DRIVER, model, gpus[:1]),
            Shape("dgx_a100_8_gpus", "dgx-a100, 8 GPUs", NVIDIA_DRIVER, model, gpus[:8]),
        ]
    migs = [n for n in names if "-mig-" in n]
    return [
        Shape("mig_mixed_1_mig", f"mig-mixed, 1 MIG device (`{migs[0]}`)", NVIDIA_DRIVER, model, migs[:1]),
        Shape("mig_mixed_1_gpu", f"mig-mixed, 1 GPU (`{gpus[0]}`)", NVIDIA_DRIVER, model, gpus[:1]),
    ]


FAKE_SHAPES = [
    Shape("fake_1", "devplug-fake, 1 device", FAKE_DRIVER, NODE, 1),
    Shape("fake_8", "devplug-fake, 8 devices", FAKE_DRIVER, NODE, 8),
]


async def bench(workdir: Path, calls: int) -> dict[str, Any]:
    """Prepare / unprepare round trips of devplug-nvidia (per model and shape) and devplug-fake."""
    cdi = dra.cdi_root()
    targets: list[Target] = []
    try:
        async with FakeKubeAPI() as api:
            api.add_node(NODE)
            kubeconfig = api.write_kubeconfig(workdir / "nvdra-kubeconfig")
            roots = {model: workdir / f"nvdra-{model}" for model in MODELS}
            fake_root = workdir / "nvdra-fake"
            for model in MODELS:  # each NVIDIA driver on a node of its own (one pool per node)
                api.add_node(model)
            async with (
                core.started(nvidia_command("dgx-a100", roots["dgx-a100"], kubeconfig, cdi)),
                core.started(nvidia_command("mig-mixed", roots["mig-mixed"], kubeconfig, cdi)),
                core.started(fake_command(fake_root, kubeconfig, cdi)),
            ):
                for model, count in MODELS.items():
                    names = await wait_pool(api, model, NVIDIA_DRIVER, count)
                    await dra.register(roots[model] / "plugins_registry" / f"{NVIDIA_DRIVER}-reg.sock")
                    socket = roots[model] / "plugins" / NVIDIA_DRIVER / "dra.sock"
                    targets.append(Target(model, socket, api, cdi, nvidia_shapes(model, names)))
                await wait_pool(api, NODE, FAKE_DRIVER, 8)
                await dra.register(fake_root / "plugins_registry" / f"{FAKE_DRIVER}-reg.sock")
                targets.append(Target("fake", dra.dra_socket(fake_root), api, cdi, FAKE_SHAPES))
                await anyio.to_thread.run_sync(alternate, targets, calls)
    finally:
        for target in targets:
            target.close()
        shutil.rmtree(cdi, ignore_errors=True)
    figures: dict[str, Any] = {
        "checkpoint_filesystem": dra.filesystem(workdir),
        "cdi_filesystem": dra.filesystem(cdi.parent),
        "target_p50_ms": TARGET_P50_MS,
        "shapes": {},
    }
    for target in targets:
        for shape in target.shapes:
            samples = target.samples[shape.key]
            figures["shapes"][shape.key] = {
                "label": shape.label,
                "driver": "devplug-fake" if shape.driver == FAKE_DRIVER else "devplug-nvidia",
                "devices": shape.count,
                "prepare": core.summary(samples["prepare"]),
                "unprepare": core.summary(samples["unprepare"]),
            }
    return figures


def _p50_ms(func: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        before = time.perf_counter()
        func()
        samples.append(time.perf_counter() - before)
    return float(core.summary(samples)["p50"])


def _spec_figures(plugin: Any, shape: Shape, runs: int) -> dict[str, Any]:
    import yaml

    from devplug.models import AllocatedDevice
    from devplug_nvidia._dra._cdi import _ordered, build_claim_spec, spec_yaml

    assert isinstance(shape.devices, list)
    by_name = {d.name: d for d in plugin.devices}
    named = [(n, plugin._by_name[n]) for n in shape.devices]
    devices = [
        AllocatedDevice(request="gpu", name=n, pool=shape.node, device=by_name[n]) for n in shape.devices
    ]

    def build() -> Any:
        return build_claim_spec(
            NVIDIA_DRIVER,
            "uid",
            named,
            plugin.config,
            present=plugin.present,
            driver_files=plugin.driver_files,
            proc=plugin.proc,
        )

    spec = build()
    text = spec_yaml(spec)
    data = _ordered(spec.to_dict(), "spec")

    def python_dump() -> str:  # PyYAML's pure-Python emitter, where PyYAML lacks libyaml
        return "---\n" + yaml.dump(data, Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False)

    figures: dict[str, Any] = {
        "claim_spec": _p50_ms(lambda: plugin.claim_spec("uid", devices), runs),
        "build": _p50_ms(build, runs),
        "spec_yaml": _p50_ms(lambda: spec_yaml(spec), runs),
        "spec_bytes": len(text),
        "libyaml": bool(yaml.__with_libyaml__),
        "yaml_python_dumper": _p50_ms(python_dump, runs),
        "python_dumper_same_text": python_dump() == text,
    }
    return figures


def breakdown(workdir: Path, runs: int) -> dict[str, Any]:
    """The claim spec's pieces in this process, per shape (p50, ms): the whole
    ``NvidiaDraPlugin.claim_spec``; building the spec (MIG capability files read); writing it as
    YAML as the driver does (PyYAML's pure-Python ``safe_dump``); and the same text through
    libyaml's ``CSafeDumper``, where PyYAML has it."""
    import yaml

    from devplug_nvidia.config import NvidiaSettings
    from devplug_nvidia.dra import NvidiaDraPlugin
    from devplug_nvidia.testing import MODELS as FAKE_MACHINES
    from devplug_nvidia.testing import FakeNvml, write_root

    out: dict[str, Any] = {"runs": runs, "libyaml": bool(yaml.__with_libyaml__)}
    for model in MODELS:
        root = write_root(FAKE_MACHINES[model], workdir / f"nvdra-breakdown-{model}")
        settings = NvidiaSettings(driver_root=str(root), driver_name=NVIDIA_DRIVER)
        plugin = NvidiaDraPlugin.discover(
            settings, module=FakeNvml(FAKE_MACHINES[model]), sysfs=root / "sys", proc=root / "proc"
        )
        for shape in nvidia_shapes(model, [d.name for d in plugin.devices]):
            out[shape.key] = _spec_figures(plugin, shape, runs)
    return out


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        return {
            "machine": dra.machine_info(),
            "prepare": await bench(workdir, 40 if quick else 200),
            "breakdown": breakdown(workdir, 20 if quick else 100),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
