"""Real-hardware check of devplug_nvidia: what it finds on this machine's GPUs, as one JSON document.

python bench/nvidia_real.py [--fake-nvml MODEL] [--out FILE]

Runs, against the real NVML (``pynvml``): discovery, the link matrix and preferred allocation,
a full plugin served to a FakeKubelet with Allocate under every device-list strategy, the
feature labels, and an event-set round trip (register the health events, wait with a short
timeout, free). Then the DRA driver (``dra``): the ResourceSlices built from this machine's
NVML, published through FakeKubeAPI (which checks every write as resource.k8s.io/v1) and
checked again against the API's limits and, where kubernetes-validate is installed, the
resource.k8s.io/v1 schema; a claim for a GPU and one for a MIG device (if there is one)
prepared and unprepared through FakeKubelet's DRA mode, with each CDI spec checked (the IDs the
kubelet gets, the spec's devices, device nodes that exist on this host) and removed at
unprepare. Without an NVIDIA GPU it says why and exits 0. ``--fake-nvml`` runs the same steps on
a fake machine model, to check the script itself where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from devplug.logging import configure as configure_logging
from devplug.testing import FakeKubelet, serving
from devplug_nvidia._device_plugin._preferred import preferred
from devplug_nvidia._gpu._links import LinkMatrix, read_links
from devplug_nvidia._gpu._nvml import Nvml, NvmlError
from devplug_nvidia.discovery import apply_mig_strategy, discover_devices
from devplug_nvidia.labels import LabelSettings, node_labels

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from devplug.models import Device
    from devplug_nvidia._config._file import DeviceListStrategy
    from devplug_nvidia._gpu._model import GpuRecord

STRATEGIES: tuple[DeviceListStrategy, ...] = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
EVENT_WAIT_MS = 500
DRA_DRIVER = "gpu.nvidia.com"
DRA_NODE = "node-real"
DRA_NAMESPACE = "bench"
MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64


def _step(report: dict[str, Any], name: str, func: Callable[[], Any]) -> Any:
    """Run one step; its result or its error goes into the report, the check goes on."""
    start = time.perf_counter()
    try:
        result = func()
    except Exception as exc:
        report[name] = {"error": _describe(exc), "trace": traceback.format_exc(limit=4)}
        return None
    report[name] = result
    report.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 3)
    return result


def _open(fake: str | None, root: Path | None) -> Nvml:
    if fake is None:
        return Nvml.open()
    from devplug_nvidia.testing import fake_nvml, write_root

    module = fake_nvml(fake)
    assert root is not None
    write_root(module.model, root)
    return Nvml.open(module)


def _record_json(record: GpuRecord) -> dict[str, Any]:
    return {
        "kind": record.kind,
        "index": record.index,
        "uuid": record.uuid,
        "name": record.name,
        "memory_mib": record.memory_mib,
        "bus_id": record.bus_id,
        "numa_node": record.numa_node,
        "compute_capability": list(record.compute_capability),
        "mig_enabled": record.mig_enabled,
        "mig_profile": record.mig.profile if record.mig else None,
    }


def _timings(records: Sequence[GpuRecord], links: LinkMatrix) -> dict[str, Any]:
    """Preferred allocation over this machine's matrix: each size, its choice and the call's time."""
    gpus = {r.uuid: r for r in records if r.kind == "gpu"}
    ids = list(gpus)
    out: dict[str, Any] = {}
    for size in range(1, len(ids) + 1):
        samples = []
        for _ in range(50):
            start = time.perf_counter()
            chosen = preferred(ids, [], size, records_by_id=gpus, links=links)
            samples.append((time.perf_counter() - start) * 1e6)
        samples.sort()
        out[str(size)] = {
            "chosen": [gpus[c].index for c in chosen],
            "score": links.set_score(chosen),
            "p50_us": round(statistics.median(samples), 1),
            "max_us": round(samples[-1], 1),
        }
    return out


def _event_round_trip(nvml: Nvml, records: Sequence[GpuRecord]) -> dict[str, Any]:
    """Register the health events on every GPU, wait once with a short timeout, free the set."""
    wanted = 0
    for name in (
        "nvmlEventTypeXidCriticalError",
        "nvmlEventTypeDoubleBitEccError",
        "nvmlEventTypeSingleBitEccError",
    ):
        wanted |= nvml.const(name)
    event_set = nvml.call("nvmlEventSetCreate")
    registered, skipped = [], {}
    try:
        for record in records:
            if record.kind != "gpu":
                continue
            handle = nvml.call("nvmlDeviceGetHandleByUUID", record.uuid)
            try:
                supported = int(nvml.call("nvmlDeviceGetSupportedEventTypes", handle)) & wanted
                nvml.call("nvmlDeviceRegisterEvents", handle, supported, event_set)
                registered.append({"gpu": record.index, "mask": hex(supported)})
            except NvmlError as exc:
                skipped[record.index] = f"{exc.call}: code {exc.code}"
        start = time.perf_counter()
        try:
            event = nvml.call("nvmlEventSetWait", event_set, EVENT_WAIT_MS)
            outcome: Any = {"event_type": int(event.eventType), "data": int(event.eventData)}
        except NvmlError as exc:
            outcome = {"error_code": exc.code, "timeout": exc.code == 10}
        waited = round((time.perf_counter() - start) * 1000, 1)
    finally:
        nvml.call("nvmlEventSetFree", event_set)
    return {
        "registered": registered,
        "skipped": skipped,
        "wait_ms": EVENT_WAIT_MS,
        "waited_ms": waited,
        **outcome,
    }


async def _plugin_round(records: list[GpuRecord], links: LinkMatrix) -> dict[str, Any]:
    """A full plugin per device-list strategy against a FakeKubelet: register, list, Allocate."""
    from devplug_nvidia.config import NvidiaSettings
    from devplug_nvidia.plugin import NvidiaPlugin

    resources = apply_mig_strategy(records, "none")
    gpus = resources.get("nvidia.com/gpu", [])
    by_id = {r.uuid: r for r in gpus}

    class Plugin(NvidiaPlugin):
        # The preferred-allocation hook as the plugin is meant to wire it (uuid device IDs).
        async def preferred_allocation(
            self, available: Sequence[Device], must_include: Sequence[Device], size: int
        ) -> Sequence[str] | None:
            return preferred(
                [d.id for d in available],
                [d.id for d in must_include],
                size,
                records_by_id=by_id,
                links=links,
                policy=self.config.shared_devices_allocation_policy,
            )

    results: dict[str, Any] = {}
    for strategy in STRATEGIES:
        # A kubelet of its own per strategy: each plugin registers on a clean socket directory.
        dp = Path(tempfile.mkdtemp(prefix="dpn-", dir="/tmp"))
        config = NvidiaSettings(device_list_strategy=(strategy,), device_plugin_dir=dp)
        try:
            with anyio.fail_after(30):
                async with (
                    FakeKubelet(dp) as kubelet,
                    serving(Plugin("nvidia.com/gpu", gpus, config), kubelet),
                ):
                    listed = await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == len(gpus))
                    ids = [d.id for d in listed]
                    allocation = await kubelet.allocate("nvidia.com/gpu", ids[:2])
                    entry: dict[str, Any] = {
                        "devices": len(ids),
                        "healthy": sum(d.healthy for d in listed),
                        "numa": [list(d.numa_nodes) for d in listed],
                        "envs": dict(allocation.envs),
                        "mounts": [m.container_path for m in allocation.mounts],
                        "annotations": dict(allocation.annotations),
                        "cdi_devices": list(allocation.cdi_devices),
                    }
                    if len(ids) > 1:
                        entry["preferred_2"] = await kubelet.preferred_allocation(
                            "nvidia.com/gpu", ids, (), 2
                        )
                    results[strategy] = entry
        except Exception as exc:
            results[strategy] = {"error": _describe(exc)}
        finally:
            _remove(dp)
    return results


def _slice_problems(obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a ResourceSlice: its validation (FakeKubeAPI's port of
    ValidateResourceSlice), the schema where kubernetes-validate is installed, and the limits."""
    from devplug.testing._kubeapi.validation import validate_slice

    problems = [str(e) for e in validate_slice(obj)]
    try:
        import kubernetes_validate
    except ImportError:
        problems_schema = ["(schema not checked: kubernetes-validate is not installed)"]
    else:
        try:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
            problems_schema = []
        except kubernetes_validate.ValidationError as exc:
            problems_schema = [f"schema: {'.'.join(map(str, exc.path))}: {exc.message}"]
    devices = obj["spec"].get("devices") or []
    if len(devices) > MAX_DEVICES_PER_SLICE:
        problems.append(f"{len(devices)} devices in one slice (at most {MAX_DEVICES_PER_SLICE})")
    for device in devices:
        fields = len(device.get("attributes") or {}) + len(device.get("capacity") or {})
        if fields > MAX_ATTRIBUTES_AND_CAPACITIES:
            problems.append(f"{device['name']}: {fields} attributes and capacities")
        for name, value in (device.get("attributes") or {}).items():
            text = value.get("string", value.get("version"))
            if isinstance(text, str) and len(text) > MAX_STRING_ATTRIBUTE:
                problems.append(f"{device['name']}: attribute {name} is {len(text)} characters")
    return problems + [p for p in problems_schema if not p.startswith("(")]


def _check_spec(spec: dict[str, Any], uid: str, device: str, root: Path | None) -> dict[str, Any]:
    """The claim's CDI spec: its kind and device name, and its device nodes on this host (under
    the fake model's root with --fake-nvml)."""
    problems = []
    if spec.get("kind") != f"k8s.{DRA_DRIVER}/claim":
        problems.append(f"kind {spec.get('kind')}")
    names = [d["name"] for d in spec.get("devices") or []]
    if names != [f"{uid}-{device}"]:
        problems.append(f"devices {names}")
    nodes = [n for d in spec.get("devices") or [] for n in d["containerEdits"].get("deviceNodes") or []]
    nodes += (spec.get("containerEdits") or {}).get("deviceNodes") or []
    # A node with its type, major and minor (a MIG capability node) is created from them in the
    # container; the others are taken from the host path, which must exist.
    paths = [n.get("hostPath") or n["path"] for n in nodes if "major" not in n]
    if root is not None:  # the fake model's stand-ins live under its root
        paths = [p if p.startswith(str(root)) else str(root) + p for p in paths]
    missing = [p for p in paths if not os.path.exists(p)]
    problems += [f"device node {p} does not exist" for p in missing]
    made = [f"{n['path']} (c {n.get('major')}:{n.get('minor')})" for n in nodes if "major" in n]
    return {"device_nodes": [n["path"] for n in nodes], "created_from_numbers": made, "problems": problems}


@asynccontextmanager
async def _dra_node(plugin: Any, work: Path) -> AsyncIterator[tuple[Any, FakeKubelet, Path]]:
    """FakeKubeAPI, a FakeKubelet in DRA mode with its root in ``work``, and ``plugin`` served
    as the DRA driver, registered: (api, kubelet, kubelet root)."""
    from devplug.testing import FakeKubeAPI, serving_dra

    kubelet_root = work / "k"
    async with (
        FakeKubeAPI() as api,
        FakeKubelet(
            work / "dp",
            plugins_registry_dir=kubelet_root / "plugins_registry",
            dra=True,
            kube_api=api,
            node_name=DRA_NODE,
        ) as kubelet,
        serving_dra(plugin, api, kubelet_root, node_name=DRA_NODE),
    ):
        await kubelet.wait_for_usable(DRA_DRIVER, timeout=30)
        yield api, kubelet, kubelet_root


async def _dra_round(plugin: Any, root: Path | None) -> dict[str, Any]:
    """The DRA driver over ``plugin``: slices published and checked; a GPU claim and a MIG
    claim prepared, their CDI specs checked, unprepared."""
    import yaml

    work = Path(tempfile.mkdtemp(prefix="dpr-", dir="/tmp"))
    out: dict[str, Any] = {"devices": [d.name for d in plugin.devices]}
    try:
        with anyio.fail_after(120):
            async with _dra_node(plugin, work) as (api, kubelet, kubelet_root):
                expected = -(-len(plugin.devices) // MAX_DEVICES_PER_SLICE) or 1
                slices = await api.wait_for_slices(
                    node=DRA_NODE, driver=DRA_DRIVER, count=expected, timeout=30
                )
                problems = [p for s in slices for p in _slice_problems(s)]
                out["slices"] = len(slices)
                out["slice_problems"] = problems
                published = [d for s in slices for d in s["spec"].get("devices") or []]
                kinds = {d["name"]: d["attributes"]["type"]["string"] for d in published}
                chosen = [
                    n for kind in ("gpu", "mig") for n in [*(n for n, k in kinds.items() if k == kind)][:1]
                ]
                claims: dict[str, Any] = {}
                for number, device in enumerate(chosen):
                    name = f"real-{number}"
                    api.add_claim(DRA_NAMESPACE, name, requests=[("gpu", [device])], device_class=DRA_DRIVER)
                    uid = str(
                        api.allocate_claim(DRA_NAMESPACE, name, node=DRA_NODE, driver=DRA_DRIVER)["metadata"][
                            "uid"
                        ]
                    )
                    ref = (DRA_NAMESPACE, name, uid)
                    began = time.perf_counter()
                    results = await kubelet.prepare(DRA_DRIVER, [ref])
                    prepared = time.perf_counter()
                    ids = [i for d in results[uid].devices for i in d.cdi_device_ids]
                    spec_file = kubelet_root / "cdi" / f"k8s.{DRA_DRIVER}-claim_{uid}.yaml"
                    entry = _check_spec(yaml.safe_load(spec_file.read_text()), uid, device, root)
                    if ids != [f"k8s.{DRA_DRIVER}/claim={uid}-{device}"]:
                        entry["problems"].append(f"CDI IDs {ids}")
                    before = time.perf_counter()
                    await kubelet.unprepare(DRA_DRIVER, [ref])
                    unprepared = time.perf_counter()
                    if spec_file.exists():
                        entry["problems"].append(f"{spec_file.name} left after unprepare")
                    claims[device] = {
                        "kind": kinds[device],
                        "cdi_device_ids": ids,
                        "prepare_ms": round((prepared - began) * 1000, 2),
                        "unprepare_ms": round((unprepared - before) * 1000, 2),
                        **entry,
                    }
                out["claims"] = claims
    finally:
        _remove(work)
    failed = out["slice_problems"] + [f"{d}: {p}" for d, c in out["claims"].items() for p in c["problems"]]
    if failed:
        raise RuntimeError("; ".join(failed))
    return out


async def _shares_round(plugin: Any) -> dict[str, Any]:
    """NVIDIA v0.5.0's consumable shares on this machine: the first GPU as published (shared,
    its memory a capacity), two claims given a share of it each by FakeKubeAPI's allocator,
    both prepared (each answer naming its share), then unprepared."""
    work = Path(tempfile.mkdtemp(prefix="dps-", dir="/tmp"))
    out: dict[str, Any] = {"problems": []}
    try:
        with anyio.fail_after(120):
            async with _dra_node(plugin, work) as (api, kubelet, _):
                slices = await api.wait_for_slices(node=DRA_NODE, driver=DRA_DRIVER, timeout=30)
                published = [d for s in slices for d in s["spec"].get("devices") or []]
                gpu = next(d for d in published if d["attributes"]["type"]["string"] == "gpu")
                out["gpu"] = {
                    "name": gpu["name"],
                    "allowMultipleAllocations": gpu.get("allowMultipleAllocations"),
                    "capacity": gpu.get("capacity"),
                    "gpuModuleID": gpu["attributes"].get("gpuModuleID"),
                    "numaNode": gpu["attributes"].get("resource.kubernetes.io/numaNode"),
                }
                refs = []
                for number in range(2):
                    name = f"share-{number}"
                    api.add_claim(
                        DRA_NAMESPACE,
                        name,
                        requests=[("gpu", 1)],
                        device_class=DRA_DRIVER,
                        capacity={"gpu": {"memory": "1Gi"}},  # memory mode: all of it by default
                    )
                    claim = api.allocate_claim(
                        DRA_NAMESPACE, name, node=DRA_NODE, driver=DRA_DRIVER, devices=[gpu["name"]]
                    )
                    (result,) = claim["status"]["allocation"]["devices"]["results"]
                    refs.append(((DRA_NAMESPACE, name, str(claim["metadata"]["uid"])), result))
                began = time.perf_counter()
                answers = await kubelet.prepare(DRA_DRIVER, [ref for ref, _ in refs])
                out["prepare_both_ms"] = round((time.perf_counter() - began) * 1000, 2)
                shares = []
                for ref, result in refs:
                    answer = answers[ref[2]]
                    if answer.error:
                        out["problems"].append(f"{ref[1]}: {answer.error}")
                        continue
                    (device,) = answer.devices
                    shares.append(device.share_id)
                    if device.share_id != result.get("shareID"):
                        out["problems"].append(
                            f"{ref[1]}: share {device.share_id}, allocated {result.get('shareID')}"
                        )
                out["shares"] = shares
                out["consumed"] = [result.get("consumedCapacity") for _, result in refs]
                await kubelet.unprepare(DRA_DRIVER, [ref for ref, _ in refs])  # raises on an error
    finally:
        _remove(work)
    if out["problems"] or len(set(out.get("shares") or [])) != 2:
        raise RuntimeError(f"shares: {out}")
    return out


def _dra_plugin(fake: str | None, root: Path | None, **more: Any) -> Any:
    """NvidiaDraPlugin on this machine's NVML (or the fake model's, on its tree under ``root``);
    ``more``: further settings (``consumable_shares``, ``feature_gates``)."""
    from devplug_nvidia.config import NvidiaSettings
    from devplug_nvidia.dra import NvidiaDraPlugin

    if fake is None:
        return NvidiaDraPlugin.discover(NvidiaSettings(driver_name=DRA_DRIVER, **more))
    from devplug_nvidia.testing import fake_nvml

    assert root is not None
    settings = NvidiaSettings(driver_root=str(root), driver_name=DRA_DRIVER, **more)
    return NvidiaDraPlugin.discover(settings, module=fake_nvml(fake), sysfs=root / "sys", proc=root / "proc")


def _dra_steps(report: dict[str, Any], fake: str | None, root: Path | None) -> None:
    """The DRA driver's steps: as NVIDIA's by default, then with consumable shares."""
    plugin = _step(report, "dra_discovery", lambda: _dra_plugin(fake, root))
    if plugin is not None:
        report["dra_discovery"] = {"devices": len(plugin.devices)}
        _step(report, "dra", lambda: anyio.run(_dra_round, plugin, root))
    shares = {"consumable_shares": "memory", "feature_gates": "ConsumableShares=true"}
    shared = _step(report, "dra_shares_discovery", lambda: _dra_plugin(fake, root, **shares))
    if shared is not None:
        report.pop("dra_shares_discovery", None)
        _step(report, "dra_shares", lambda: anyio.run(_shares_round, shared))


def _describe(exc: BaseException) -> str:
    """The leaf errors of an exception (groups flattened), one line."""
    inner = getattr(exc, "exceptions", None)  # an exception group (Python >= 3.11)
    if isinstance(inner, tuple) and inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(exc).__name__}: {exc}"


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fake-nvml", metavar="MODEL", help="use a fake machine model instead of pynvml")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    # Logs to stderr, warnings up: stdout carries the JSON.
    configure_logging("console", "warning", stream=sys.stderr)
    report: dict[str, Any] = {"fake_nvml": args.fake_nvml}
    work = Path(tempfile.mkdtemp(prefix="nvreal-"))
    root = work / "root" if args.fake_nvml else None
    try:
        nvml = _open(args.fake_nvml, root)
    except NvmlError as exc:
        report |= {"gpu": False, "reason": str(exc)}
        print(json.dumps(report, indent=2))
        print(f"# no GPU here, every step skipped: {exc}", file=sys.stderr)
        return 0
    sysfs = root / "sys" if root else Path("/sys")
    proc = root / "proc" if root else Path("/proc")
    with nvml:
        _step(report, "driver", lambda: str(nvml.call("nvmlSystemGetDriverVersion")))
        count = _step(report, "gpu_count", lambda: int(nvml.call("nvmlDeviceGetCount")))
        report["gpu"] = bool(count)
        if not count:
            report.setdefault("reason", "NVML lists no GPU")
            print(json.dumps(report, indent=2))
            print(f"# no GPU here, the other steps skipped: {report['reason']}", file=sys.stderr)
            return 0
        records = _step(report, "discovery", lambda: discover_devices(nvml, sysfs=sysfs, proc=proc)) or []
        if records:
            report["discovery"] = [_record_json(r) for r in records]
        links = _step(report, "link_matrix", lambda: read_links(nvml))
        if isinstance(links, LinkMatrix):
            report["link_matrix"] = links.describe()
            _step(report, "preferred_allocation", lambda: _timings(records, links))
        settings = LabelSettings(no_timestamp=True)
        _step(report, "labels", lambda: node_labels(nvml, settings, sysfs=sysfs, proc=proc))
        _step(report, "event_round_trip", lambda: _event_round_trip(nvml, records))
    if records and isinstance(links, LinkMatrix):
        _step(report, "plugin", lambda: anyio.run(_plugin_round, records, links))
    if records:
        _dra_steps(report, args.fake_nvml, root)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)
    failed = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    plugin = report.get("plugin")
    if isinstance(plugin, dict):
        failed += [f"plugin.{k}" for k, v in plugin.items() if isinstance(v, dict) and "error" in v]
    print(f"# steps failed: {failed or 'none'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
