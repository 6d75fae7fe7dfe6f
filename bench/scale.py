"""Large device lists: 10,000 and 50,000 devices in one resource, and what fits in 4 MiB.

    python bench/scale.py [--quick] [--out bench/results-scale.json]

Time to send the list is measured from the kubelet's side: the clock starts when a new state
file has been renamed into place (``devplug-fake --state-file``), and stops when the fake
kubelet has the ListAndWatch message holding it (``ResourceView.received_at``); successive runs
flip the health of one device so that every run sends the whole list again. Bytes on the wire
are ``ListAndWatchResponse.ByteSize()`` of the message received. The largest count under the
kubelet's 4 MiB receive limit is computed from the framework's own encoding
(``devplug._convert.device_to_pb``) for typical ID shapes. ``breakdown`` times, in this
process, the steps the plugin takes for one 10,000-device state file. Prints JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import core
import yaml

from devplug import _convert
from devplug._device_plugin.servicer import MAX_MESSAGE_BYTES
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug.models import Device, Health
from devplug.testing import FakeKubelet
from devplug_fake import StateFile

if TYPE_CHECKING:
    from collections.abc import Callable

RESOURCE = core.RESOURCE


def state_text(count: int, unhealthy_first: bool) -> str:
    devices = [{"id": f"fake-{i}", "health": "Healthy"} for i in range(count)]
    if unhealthy_first and devices:
        devices[0]["health"] = "Unhealthy"
    return json.dumps({"devices": devices})


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wire_bytes(devices: list[tuple[str, str, tuple[int, ...]]]) -> int:
    message = pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=device_id,
                health=health,
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]) if numa else None,
            )
            for device_id, health, numa in devices
        ]
    )
    return message.ByteSize()


async def bench_large_lists(workdir: Path, runs: dict[int, int]) -> dict[str, Any]:
    """For each device count: ``runs[count]`` state-file writes, each timed until the kubelet has it."""
    dp_dir = workdir / "scale"
    state = workdir / "scale-state.json"
    state.unlink(missing_ok=True)
    results: dict[str, Any] = {}
    command = core.plugin_command(dp_dir, "--state-file", str(state))
    async with FakeKubelet(dp_dir) as kubelet, core.started(command) as process:
        await kubelet.wait_for_registration(RESOURCE, timeout=30)
        await kubelet.wait_for_devices(RESOURCE, timeout=30)  # the empty list: no state file yet
        view = kubelet.resource(RESOURCE)
        for count, n_runs in runs.items():
            texts = [state_text(count, False), state_text(count, True)]
            samples, cpu, size = [], [], 0
            for i in range(n_runs):
                unhealthy = i % 2 == 1
                seen = view.messages
                cpu_before = cpu_seconds(process.pid)
                write_atomically(state, texts[unhealthy])
                written = time.monotonic()
                with anyio.fail_after(300):
                    while True:
                        if view.messages > seen:
                            last = view.raw_lists[-1]
                            if len(last) == count and (last[0][1] != "Healthy") is unhealthy:
                                break
                        await anyio.sleep(0.002)
                samples.append(view.received_at[-1] - written)
                cpu.append(cpu_seconds(process.pid) - cpu_before)
                if not unhealthy:
                    size = wire_bytes(view.raw_lists[-1])
                await anyio.sleep(0.2)  # let the plugin settle before the next write
            results[f"devices_{count}"] = {
                "devices": count,
                "state_file_bytes": len(texts[0]),
                "wire_bytes": size,
                "wire_bytes_per_device": round(size / count, 2),
                "state_file_to_kubelet": core.summary(samples),
                "plugin_cpu_per_list": core.summary(cpu),
            }
    return results


async def bench_generated_lists(workdir: Path, runs: dict[int, int]) -> dict[str, Any]:
    """Process start → first list of ``--count N`` devices: the framework's path with no state file.

    Set against ``start_to_first_list`` of a 4-device plugin, the difference is what N devices
    cost in the plugin's own model, state, protobuf conversion and send.
    """
    results: dict[str, Any] = {}
    for count, n_runs in runs.items():
        samples = []
        for i in range(n_runs):
            dp_dir = workdir / f"gen-{count}-{i}"
            async with FakeKubelet(dp_dir) as kubelet:
                began = time.monotonic()
                async with core.started(core.plugin_command(dp_dir, "--count", str(count))):
                    await kubelet.wait_for_registration(RESOURCE, timeout=60)
                    await kubelet.wait_for_devices(RESOURCE, lambda ds, n=count: len(ds) == n, timeout=60)
                    samples.append(kubelet.resource(RESOURCE).received_at[0] - began)
        results[f"devices_{count}"] = {"devices": count, "start_to_first_list": core.summary(samples)}
    return results


def breakdown(count: int = 10_000) -> dict[str, Any]:
    """Where the plugin's time goes for one state file, timed in this process (ms).

    The same calls devplug-fake and the servicer make: the state file parsed with
    ``yaml.safe_load``, validated as a ``StateFile``, converted and sized. ``json_loads`` and
    ``yaml_c_safe_loader`` are what the parse would cost with a faster reader.
    """
    text = state_text(count, False)
    steps: dict[str, float] = {}

    def timed(name: str, func: Callable[[], Any]) -> Any:
        before = time.perf_counter()
        result = func()
        steps[name] = round((time.perf_counter() - before) * 1e3, 1)
        return result

    data = timed("yaml_safe_load", lambda: yaml.safe_load(text))
    devices = timed("validate_state_file", lambda: StateFile.model_validate(data).devices)
    message = timed("to_protobuf", lambda: _convert.list_response(devices))
    timed("byte_size_and_serialize", lambda: (message.ByteSize(), message.SerializeToString()))
    timed("json_loads", lambda: json.loads(text))
    if hasattr(yaml, "CSafeLoader"):
        timed("yaml_c_safe_loader", lambda: yaml.load(text, Loader=yaml.CSafeLoader))
    return {"devices": count, "unit": "ms", **steps}


ID_SHAPES: dict[str, Callable[[int, random.Random], str]] = {
    "GPU-<uuid>": lambda i, rng: f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
    "fake-<n>": lambda i, rng: f"fake-{i}",
}


def _varint_len(value: int) -> int:
    length = 1
    while value >= 0x80:
        value >>= 7
        length += 1
    return length


def largest_count(shape: str, numa: bool, limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """The most devices of one ID shape whose ListAndWatchResponse stays within ``limit`` bytes.

    Every device ``Healthy``; with NUMA, device i sits on node i mod 2 (node 0 costs less: proto3
    leaves a zero ID out). A repeated field's size is the sum of its entries (tag, length,
    message), each sized with the framework's encoding; the sum is checked against the whole
    message's ``ByteSize()`` over the first 1,000 devices.
    """
    rng = random.Random(0)
    make_id = ID_SHAPES[shape]
    entry_sizes: dict[tuple[int, int | None], int] = {}

    def device(device_id: str, node: int | None) -> Device:
        return Device.model_construct(
            id=device_id, health=Health.HEALTHY, numa_nodes=(node,) if node is not None else ()
        )

    def entry(device_id: str, node: int | None) -> int:
        key = (len(device_id.encode()), node)
        if key not in entry_sizes:
            message = _convert.device_to_pb(device(device_id, node))
            entry_sizes[key] = 1 + _varint_len(message.ByteSize()) + message.ByteSize()
        return entry_sizes[key]

    first = [device(make_id(i, rng), i % 2 if numa else None) for i in range(1000)]
    total = sum(entry(d.id, d.numa_nodes[0] if numa else None) for d in first)
    assert total == _convert.list_response(first).ByteSize()
    n = len(first)
    while True:
        size = entry(make_id(n, rng), n % 2 if numa else None)
        if total + size > limit:
            break
        total += size
        n += 1
    return {
        "ids": shape,
        "numa": numa,
        "example_id": first[0].id,
        "largest_count": n,
        "bytes": total,
        "bytes_per_device": round(total / n, 2),
    }


def largest_counts() -> list[dict[str, Any]]:
    return [largest_count(shape, numa) for shape in ID_SHAPES for numa in (False, True)]


async def main_async(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        lists = await bench_large_lists(workdir, {10_000: 2, 50_000: 1} if quick else {10_000: 5, 50_000: 3})
        generated = await bench_generated_lists(
            workdir, {10_000: 1, 50_000: 1} if quick else {10_000: 3, 50_000: 3}
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "machine": core.machine_info(),
        "large_lists": lists,
        "generated_lists": generated,
        "breakdown": breakdown(),
        "largest_under_limit": {"limit_bytes": MAX_MESSAGE_BYTES, "shapes": largest_counts()},
    }


def main() -> None:
    core.cli(__doc__, main_async)


if __name__ == "__main__":
    main()
