"""``devplug demo --dra``: the devplug-fake plugin as a DRA driver, with a fake kubelet and API server.

The same story as ``devplug demo``, told through Dynamic Resource Allocation: the kubelet side
(devplug.testing.FakeKubelet in DRA mode) and the API server (devplug.testing.FakeKubeAPI, real
HTTP on localhost) run in this process, the driver is a separate ``devplug-fake --api dra``
process, and everything is removed at the end.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from devplug.cli.demo.child import plugin_process
from devplug.cli.demo.narration import Narrator, tell, write_state
from devplug.testing import FakeKubeAPI, FakeKubelet

if TYPE_CHECKING:
    from devplug.testing._process import PluginProcess

DRIVER = "fake.example.com"
NODE = "demo-node"


def _slice_table(api: FakeKubeAPI) -> str:
    rows = [("DEVICE", "ID", "NUMA", "TAINTS")]
    for item in sorted(api.slices(node=NODE, driver=DRIVER), key=lambda s: s["metadata"]["name"]):
        for d in item["spec"]["devices"]:
            attrs = d.get("attributes", {})
            numa = attrs.get("numaNode", {}).get("int")
            taints = ",".join(f"{t['key']}:{t['effect']}" for t in d.get("taints") or []) or "-"
            rows.append(
                (d["name"], attrs.get("id", {}).get("string", ""), "-" if numa is None else str(numa), taints)
            )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _pool(api: FakeKubeAPI) -> tuple[int, int, int] | None:
    """(slices, generation, devices) when the node's pool is complete, else None."""
    slices = api.slices(node=NODE, driver=DRIVER)
    if not slices:
        return None
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
    if len(pools) != 1:
        return None
    generation, count = pools.pop()
    if count != len(slices):
        return None
    return count, generation, sum(len(s["spec"]["devices"]) for s in slices)


def _tainted(api: FakeKubeAPI, device: str) -> bool:
    return any(
        d["name"] == device and d.get("taints")
        for s in api.slices(node=NODE, driver=DRIVER)
        for d in s["spec"]["devices"]
    )


async def _stop(plugin: PluginProcess, root: Path, say: Narrator) -> None:
    exited = await plugin.terminate(5)
    left = sorted(p.name for d in (root / "plugins", root / "plugins_registry") for p in d.rglob("*.sock"))
    ended = f"exited with {plugin.returncode}" if exited else "still running after 5 s"
    say.step(f"SIGTERM: driver {ended}, {'sockets removed' if not left else f'LEFT BEHIND: {left}'}")
    if not exited or plugin.returncode != 0 or left:
        raise RuntimeError("the driver did not shut down cleanly; see its log above")


async def _demo(workdir: Path, out: TextIO, pace: float) -> None:
    say = Narrator(out, pace)
    root = workdir / "kubelet"
    state_file = workdir / "devices.json"
    devices: list[dict[str, object]] = [
        {"id": f"fake-{i}", "health": "Healthy", "numa_node": i % 2} for i in range(4)
    ]
    write_state(state_file, devices)
    say.step(f"work directory {workdir}")
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        say.step(f"fake API server on {api.url} (ResourceSlices, ResourceClaims, Nodes; node {NODE})")
        async with FakeKubelet(
            root / "device-plugins",
            plugins_registry_dir=root / "plugins_registry",
            dra=True,
            kube_api=api,
            node_name=NODE,
        ) as kubelet:
            say.step("fake kubelet watching plugins_registry/ (DRA manager, kubelet >= 1.34 behaviour)")
            args = [
                "--api", "dra",
                "--driver-name", DRIVER, "--node-name", NODE, "--kubeconfig", str(kubeconfig),
                "--kubelet-root", str(root), "--cdi-dir", str(workdir / "cdi"),
                "--resource", "example.com/fake", "--state-file", str(state_file),
                "--device-specs", "--log-format", "json",
            ]  # fmt: skip
            started = time.monotonic()
            async with plugin_process("devplug_fake", args, workdir) as plugin:
                say.step(f"started devplug-fake --api dra (pid {plugin.pid})")
                scene = _Scene(api, kubelet, say, started, workdir, state_file, devices)
                await plugin.guard(lambda: _story(scene))
                await _stop(plugin, root, say)


@dataclass
class _Scene:
    """Who takes part in the demo, and where."""

    api: FakeKubeAPI
    kubelet: FakeKubelet
    say: Narrator
    started: float
    workdir: Path
    state_file: Path
    devices: list[dict[str, object]]


async def _story(scene: _Scene) -> None:
    api, kubelet, say, workdir = scene.api, scene.kubelet, scene.say, scene.workdir
    started, state_file, devices = scene.started, scene.state_file, scene.devices
    reg = await kubelet.wait_for_dra_registration(DRIVER, timeout=20)
    say.step(
        f"registered {DRIVER} through {Path(reg.socket).name}, service {reg.service}, "
        f"{(reg.at - started) * 1000:.0f} ms after the process started"
    )
    await api.wait_for(lambda: _pool(api) is not None and _pool(api)[2] == 4, timeout=10)  # type: ignore[index]
    count, generation, _ = _pool(api) or (0, 0, 0)
    say.step(f"ResourceSlices published: {count} slice, pool {NODE} generation {generation}")
    say.detail(_slice_table(api))
    await say.pause()

    api.add_claim("default", "demo", requests=[("fake", 2)], device_class=DRIVER)
    claim = api.allocate_claim("default", "demo", node=NODE, driver=DRIVER, count=2)
    uid = claim["metadata"]["uid"]
    chosen = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
    say.step(f"claim default/demo allocated by the scheduler: {', '.join(chosen)}")
    results = await kubelet.prepare(DRIVER, [("default", "demo", uid)])
    answer = results[uid]
    say.step("NodePrepareResources answered")
    for device in answer.devices:
        say.detail(f"{device.device}: cdi {', '.join(device.cdi_device_ids) or '(with the first device)'}")
    spec_path = workdir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json"
    spec: dict[str, Any] = json.loads(spec_path.read_text())
    edits = spec["devices"][0]["containerEdits"]
    say.detail(f"CDI spec {spec_path.name}: env {edits.get('env')}")
    await say.pause()

    for health, wanted in (("Unhealthy", "Unhealthy"), ("Healthy", "Healthy")):
        devices[2]["health"] = health
        changed = time.monotonic()
        write_state(state_file, devices)
        await kubelet.wait_for_health(DRIVER, lambda h: h.get((NODE, "fake-2")) == wanted)  # noqa: B023
        seen = time.monotonic() - changed
        await api.wait_for(lambda: _tainted(api, "fake-2") == (health == "Unhealthy"))  # noqa: B023
        say.step(
            f"fake-2 marked {health}: the kubelet's health stream saw it after {seen * 1000:.1f} ms; "
            f"taint {'published' if health == 'Unhealthy' else 'removed'} after "
            f"{(time.monotonic() - changed) * 1000:.1f} ms"
        )
        await say.pause()

    restarted = time.monotonic()
    await kubelet.restart()
    say.step("kubelet restarted: every ResourceSlice of the node deleted, plugins_registry/ scanned again")
    await api.wait_for(lambda: (_pool(api) or (0, 0, 0))[2] == 4, timeout=10)
    took = (time.monotonic() - restarted) * 1000
    say.step(f"slices restored by the driver {took:.1f} ms after the restart began")
    reg = await kubelet.wait_for_dra_registration(DRIVER, count=2, timeout=10)
    await kubelet.wait_for_usable(DRIVER)
    say.step(f"registered again {(reg.at - restarted) * 1000:.1f} ms after the restart")
    again = await kubelet.prepare(DRIVER, [("default", "demo", uid)])
    same = [d.device for d in again[uid].devices] == [d.device for d in answer.devices]
    say.step(f"prepare after the restart: {'the same answer, from the checkpoint' if same else 'DIFFERENT'}")
    await kubelet.unprepare(DRIVER, [("default", "demo", uid)])
    say.step(f"NodeUnprepareResources: CDI spec {'removed' if not spec_path.exists() else 'LEFT BEHIND'}")
    await say.pause()


def main(out: TextIO | None = None, pace: float | None = None) -> int:
    """Run the DRA demo; returns the exit status (0 on success)."""
    over = "real gRPC on unix sockets and HTTP"
    return tell(_demo, name="devplug demo --dra", out=out, pace=pace, over=over)
