"""``devplug demo``: a fake kubelet and the devplug-fake plugin, talking for real, narrated.

Everything happens in a temporary directory that is removed at the end: the kubelet side runs
in this process (devplug.testing.FakeKubelet), the plugin is a separate ``devplug-fake``
process, and they speak gRPC over unix sockets exactly as on a node.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

from devplug.cli.demo.child import plugin_process
from devplug.cli.demo.narration import Narrator, tell, write_state
from devplug.models import Health
from devplug.testing import FakeKubelet

if TYPE_CHECKING:
    from pathlib import Path

    from devplug.models import Device

RESOURCE = "example.com/fake"


def _table(devices: tuple[Device, ...]) -> str:
    rows = [("ID", "HEALTH", "NUMA")] + [
        (d.id, d.health.value, ",".join(map(str, d.numa_nodes)) or "-") for d in devices
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


async def _flap_health(
    kubelet: FakeKubelet, state_file: Path, devices: list[dict[str, object]], say: Narrator
) -> None:
    """fake-2 Unhealthy through the state file, then Healthy again, timed at the kubelet."""
    for health in ("Unhealthy", "Healthy"):
        devices[2]["health"] = health
        changed = time.monotonic()
        write_state(state_file, devices)
        wanted = Health(health)
        await kubelet.wait_for_devices(RESOURCE, lambda ds: ds[2].health is wanted)  # noqa: B023
        say.step(
            f"fake-2 marked {health} in the state file; the kubelet saw it after "
            f"{(time.monotonic() - changed) * 1000:.1f} ms: allocatable "
            f"{kubelet.allocatable(RESOURCE)}/{kubelet.capacity(RESOURCE)}"
        )
        await say.pause()


async def _demo(workdir: Path, out: TextIO, pace: float) -> None:
    say = Narrator(out, pace)
    dp_dir = workdir / "device-plugins"
    state_file = workdir / "devices.json"
    devices: list[dict[str, object]] = [
        {"id": f"fake-{i}", "health": "Healthy", "numa_node": i % 2} for i in range(4)
    ]
    write_state(state_file, devices)
    say.step(f"work directory {workdir}")

    async with FakeKubelet(dp_dir) as kubelet:
        say.step(f"fake kubelet serving {kubelet.socket_path.name} (Registration, kubelet >= 1.26 behaviour)")
        args = [
            "--device-plugin-dir", str(dp_dir),
            "--resource", RESOURCE,
            "--state-file", str(state_file),
            "--device-specs", "--cdi", "--cdi-dir", str(workdir / "cdi"),
            "--log-format", "json",
        ]  # fmt: skip
        started = time.monotonic()
        async with plugin_process("devplug_fake", args, workdir) as plugin:
            say.step(f"started devplug-fake (pid {plugin.pid})")
            endpoint = await plugin.guard(lambda: _talk(kubelet, started, state_file, devices, say))
            exited = await plugin.terminate(5)
            gone = not (dp_dir / endpoint).exists()
            ended = f"exited with {plugin.returncode}" if exited else "still running after 5 s"
            say.step(f"SIGTERM: plugin {ended}, socket {'removed' if gone else 'LEFT BEHIND'}")
            if not exited or plugin.returncode != 0 or not gone:
                raise RuntimeError("the plugin did not shut down cleanly; see its log above")


async def _talk(
    kubelet: FakeKubelet, started: float, state_file: Path, devices: list[dict[str, object]], say: Narrator
) -> str:
    """Registration, the device list, Allocate, health, a kubelet restart; the last endpoint."""
    reg = await kubelet.wait_for_registration(RESOURCE, timeout=15)
    say.step(
        f"registered {RESOURCE} on {reg.endpoint} "
        f"{(reg.at - started) * 1000:.0f} ms after the process started"
    )
    listed = await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
    say.step(f"device list received: capacity {kubelet.capacity(RESOURCE)}")
    say.detail(_table(listed))
    await say.pause()

    allocation = await kubelet.allocate(RESOURCE, ["fake-1", "fake-3"])
    say.step("Allocate(fake-1, fake-3) answered")
    say.detail(f"envs: {allocation.envs}")
    say.detail("devices: " + ", ".join(f"{d.host_path} -> {d.container_path}" for d in allocation.devices))
    say.detail(f"cdi: {', '.join(allocation.cdi_devices)}")
    await say.pause()

    await _flap_health(kubelet, state_file, devices, say)

    await kubelet.restart()
    restarted = time.monotonic()
    say.step("kubelet restarted: plugin sockets deleted, new kubelet.sock created")
    again = await kubelet.wait_for_registration(RESOURCE, count=2)
    await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
    say.step(
        f"re-registered on {again.endpoint} after {(again.at - restarted) * 1000:.1f} ms; "
        f"device list back after {(time.monotonic() - restarted) * 1000:.1f} ms"
    )
    await say.pause()
    return again.endpoint


def main(out: TextIO | None = None, pace: float | None = None, *, dra: bool = False) -> int:
    """Run the demo; returns the exit status (0 on success).

    ``pace``: seconds to pause after the main steps; default 0.8 on a terminal, 0 otherwise.
    ``dra``: the DRA story instead (:mod:`devplug.cli.demo.dra_story`).
    """
    if dra:
        from devplug.cli.demo import dra_story as _demo_dra

        return _demo_dra.main(out, pace)
    return tell(_demo, name="devplug demo", out=out, pace=pace, over="real gRPC on unix sockets")
