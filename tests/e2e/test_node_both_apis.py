"""Both APIs on the real node: devplug-fake serving example.com/fake through the device plugin and
fake.example.com through DRA from one process (and devplug-nvidia, fake NVML, nvidia.com/gpu and
gpu.nvidia.com), and a node moving from the device plugin to DRA while the device plugin's pods
run.

The random test creates pods asking the device plugin's resource and pods with a claim (DRA),
seeded (``DEVPLUG_E2E_SEED`` to repeat a run; the seed is in every failure message), each
living a random short while; every container reports its devices and the kernel's uptime when it
starts and when it ends (the pods share the host's kernel), and no device may be in two running
containers at once."""

from __future__ import annotations

import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.node_kit import (
    ROOT,
    Node,
    events,
    localnode,
    log_of,
    noop_hook,
    plugin_process,
    wait_for,
    wait_streaming,
)
from tests.e2e.test_dra import FAKE_DRIVER, allocated_devices, published, template, without_slices

pytestmark = pytest.mark.timeout(900)

RESOURCE = "example.com/fake"
HELD_TAINT = f"{FAKE_DRIVER}/device-plugin"
LIFETIMES = 200
"""Pods created, each living once."""
CONCURRENT = 9
"""Pods at most pending or running at once (6 or 8 devices: some wait)."""
BUDGET = 600.0
"""Seconds the random run may take."""
LABEL = "devplug-e2e=both-apis"
REPORT = (
    "read up _ < /proc/uptime; s=$up; {devices}; sleep {seconds}; read up _ < /proc/uptime; "
    'echo "START $s ${{d:-none}} END $up" > /dev/termination-log'
)
"""What each container reports, in its termination message (read back from the pod's status):
``devices`` sets ``d`` to its devices, comma-separated."""


@dataclass(frozen=True)
class Scenario:
    command: str
    flags: Callable[[Node, Path], list[str]]
    resource: str
    """The device plugin's resource; the pods of the device plugin ask for one."""
    device_class: str
    """The DeviceClass of the claims' template."""
    devices: int
    identity: str
    """Shell that sets ``d`` to the container's devices, as both APIs name them there."""


def _fake_flags(node: Node, tmp: Path) -> list[str]:
    return [*both_flags(node), "--count", "6", "--pod-resources-interval", "1"]


def _nvidia_flags(node: Node, tmp: Path) -> list[str]:
    hook = str(noop_hook(tmp))
    return [
        *both_flags(node),
        *("--fake-nvml", "dgx-a100", "--nvidia-cdi-hook-path", hook, "--device-list-strategy", "cdi-cri"),
        *("--pod-resources-interval", "1"),
    ]


SCENARIOS = {
    "devplug-fake": Scenario(
        "devplug-fake", _fake_flags, RESOURCE, FAKE_DRIVER, 6, "d=$FAKE_VISIBLE_DEVICES"
    ),
    # Both APIs reach the container through CDI: its GPUs are the /dev/nvidiaN nodes it has.
    "devplug-nvidia": Scenario(
        "devplug-nvidia",
        _nvidia_flags,
        "nvidia.com/gpu",
        "gpu.nvidia.com",
        8,
        "d=$(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\\n' ,)",
    ),
}


def both_flags(node: Node) -> list[str]:
    flags = node.dra_flags()
    flags[flags.index("--api") + 1] = "device-plugin,dra"
    return flags


def pod(name: str, kind: str, seconds: float, scenario: Scenario) -> dict[str, Any]:
    command = REPORT.format(devices=scenario.identity, seconds=f"{seconds:.2f}")
    container: dict[str, Any] = {
        "name": "main",
        "image": localnode.BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if kind == "plugin":
        container["resources"] = {"limits": {scenario.resource: "1"}}
    else:
        container["resources"] = {"claims": [{"name": "dev"}]}
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": "both-one"}]
    key, value = LABEL.split("=")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {key: value}},
        "spec": spec,
    }


def labelled(node: Node) -> list[dict[str, Any]]:
    key, value = LABEL.split("=")
    items = node.get("pods", namespace="default")["items"]
    return [p for p in items if p["metadata"].get("labels", {}).get(key) == value]


def phases(node: Node) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"].get("phase", "Pending") for p in labelled(node)}


def intervals(pods: list[dict[str, Any]]) -> dict[str, tuple[set[str], float, float]]:
    """pod → (its devices, start, end), from each ended container's termination message."""
    out: dict[str, tuple[set[str], float, float]] = {}
    for item in pods:
        for status in item["status"].get("containerStatuses") or ():
            message = (status.get("state", {}).get("terminated") or {}).get("message") or ""
            found = re.match(r"START ([0-9.]+) (\S+) END ([0-9.]+)", message)
            if found:
                start, devices, end = found.groups()
                ids = {d for d in devices.split(",") if d and d != "none"}
                out[item["metadata"]["name"]] = (ids, float(start), float(end))
    return out


def overlaps(spans: dict[str, tuple[set[str], float, float]]) -> list[str]:
    """Every pair of pods that had one device in running containers at the same time."""
    by_device: dict[str, list[tuple[float, float, str]]] = {}
    for name, (devices, start, end) in spans.items():
        for device in devices:
            by_device.setdefault(device, []).append((start, end, name))
    found = []
    for device, spans_of in sorted(by_device.items()):
        spans_of.sort()
        latest = (float("-inf"), "")  # the latest end so far, and whose
        for start, end, name in spans_of:
            if start < latest[0]:
                found.append(f"{device}: {latest[1]} (until {latest[0]}) and {name} (from {start})")
            latest = max(latest, (end, name))
    return found


def clean(node: Node) -> None:
    node.kubectl("delete", "pods", "-l", LABEL, "--wait=true", "--timeout=120s", check=False)


@pytest.fixture
def fake_class(node: Node) -> str:
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "dra" / "deviceclass.yaml"))
    return FAKE_DRIVER


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_random_pods_of_both_apis_never_share_a_device(node: Node, tmp_path: Path, name: str) -> None:
    scenario = SCENARIOS[name]
    seed = int(os.environ.get("DEVPLUG_E2E_SEED") or random.randrange(2**31))
    print(f"seed: {seed} (DEVPLUG_E2E_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "dra" / "deviceclass.yaml"))
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "nvidia-dra" / "driver" / "deviceclasses.yaml"))
    driver = scenario.device_class  # each class selects the driver of its name
    without_slices(node, driver)
    clean(node)
    node.apply(template("both-one", scenario.device_class))
    flags = [*scenario.flags(node, tmp_path), "--log-format", "json"]
    try:
        with plugin_process(node, tmp_path, scenario.command, *flags) as proc:
            wait_streaming(proc)
            node.wait_allocatable(scenario.resource, scenario.devices)
            wait_for(
                "the driver's slices", lambda: len(published(node, driver)) == scenario.devices, timeout=90
            )
            created: dict[str, str] = {}
            started = time.monotonic()
            while len(created) < LIFETIMES and time.monotonic() - started < BUDGET:
                now = phases(node)
                active = sum(1 for p in now.values() if p in ("Pending", "Running"))
                batch = []
                for _ in range(max(0, CONCURRENT - active)):
                    if len(created) + len(batch) >= LIFETIMES:
                        break
                    kind = rng.choice(["plugin", "claim"])
                    pod_name = f"both-{len(created) + len(batch):03d}-{kind}"
                    batch.append(pod(pod_name, kind, rng.uniform(0.2, 1.2), scenario))
                if batch:
                    node.apply(*batch)
                    created.update(
                        {b["metadata"]["name"]: b["metadata"]["name"].rsplit("-", 1)[1] for b in batch}
                    )
                time.sleep(0.5)
            assert len(created) == LIFETIMES, f"seed {seed}: only {len(created)} pods created in {BUDGET:g} s"
            final = wait_for(
                "every pod ended",
                lambda: (p := phases(node)) and all(v in ("Succeeded", "Failed") for v in p.values()) and p,
                timeout=300,
            )
            ended = labelled(node)
            assert proc.poll() is None, log_of(proc)[-3000:]
            conflicts = events(proc, "allocate_refused_held") + events(proc, "prepare_refused_held")
    finally:
        clean(node)
        node.delete("resourceclaimtemplate", "both-one")
    spans = intervals(ended)
    ran = {pod_name: kind for pod_name, kind in created.items() if pod_name in spans}
    plugin_pods = sum(k == "plugin" for k in ran.values())
    failed = Counter(
        f"{p['status'].get('reason', '?')} ({created.get(p['metadata']['name'], '?')})"
        for p in ended
        if p["status"].get("phase") == "Failed"
    )
    summary = (
        f"seed {seed}: {len(created)} pods, {len(ran)} ran ({plugin_pods} device plugin, "
        f"{len(ran) - plugin_pods} DRA), {sum(v == 'Failed' for v in final.values())} failed "
        f"{dict(failed)}, {conflicts} conflicts refused"
    )
    print(summary)
    assert not overlaps(spans), f"{summary}: {overlaps(spans)}"
    # Each that ran had its one device, and both APIs served a good share of the pods.
    assert all(len(spans[pod_name][0]) == 1 for pod_name in ran), summary
    assert plugin_pods >= LIFETIMES // 4, summary
    assert len(ran) - plugin_pods >= LIFETIMES // 4, summary
    # A pod fails only at the device plugin's admission: the scheduler sent it while the node's
    # allocatable still counted a device DRA had just taken (the kubelet reports it Unhealthy,
    # and updates the node's status some seconds later), or the Allocate was refused.
    assert set(failed) <= {"UnexpectedAdmissionError (plugin)"}, summary


def test_a_node_moves_to_dra_without_draining(node: Node, tmp_path: Path, fake_class: str) -> None:
    """The device plugin's pods keep their devices while the DRA driver runs beside them; their
    devices go to claims only once they end."""
    without_slices(node)
    (tmp_path / "dp").mkdir()
    (tmp_path / "dra").mkdir()
    dp_flags = ["--kubelet-root", str(node.kubelet_root), "--count", "4", "--log-format", "json"]
    names = ("move-a", "move-b")
    node.apply(template("move-one", fake_class))
    try:
        with plugin_process(node, tmp_path / "dp", "devplug-fake", *dp_flags) as dp:
            wait_streaming(dp)
            node.wait_allocatable(RESOURCE, 4)
            for name in names:
                node.run_pod(name, resources={RESOURCE: 1})
            held = {node.pod_env(name)["FAKE_VISIBLE_DEVICES"] for name in names}
            assert len(held) == 2
        # The device plugin is gone; its pods run on.
        flags = [*node.dra_flags(), "--count", "4", "--log-format", "json"]
        flags += ["--withhold-device-plugin-pods", "--pod-resources-interval", "1"]
        with plugin_process(node, tmp_path / "dra", "devplug-fake", *flags) as driver:
            try:
                devices = wait_for(
                    "the driver's slices",
                    lambda: len(published(node, FAKE_DRIVER)) == 4 and published(node, FAKE_DRIVER),
                )
                tainted = {
                    n for n, d in devices.items() if any(t["key"] == HELD_TAINT for t in d.get("taints", []))
                }
                assert tainted == held
                claims = [{"name": "dev", "resourceClaimTemplateName": "move-one"}]
                for name in ("move-c", "move-d"):
                    node.run_pod(name, claims=claims)
                    (device,) = allocated_devices(node, name)
                    assert device not in held
                node.run_pod("move-e", claims=claims, wait=False)
                time.sleep(5)
                assert node.get("pod", "move-e")["status"].get("phase") == "Pending"
                for name in names:
                    node.delete("pod", name)
                node.wait_running("move-e", timeout=120)
                (device,) = allocated_devices(node, "move-e")
                assert device in held
                assert node.pod_env("move-e")["FAKE_VISIBLE_DEVICES"] == device
                assert driver.poll() is None, log_of(driver)[-3000:]
            finally:
                # The claims' pods go while the driver runs: their claims are unprepared.
                claimed = ("move-c", "move-d", "move-e")
                for name in claimed:
                    node.delete("pod", name, wait=False)
                for name in claimed:
                    node.delete("pod", name)
    finally:
        for name in names:
            node.delete("pod", name)
        node.delete("resourceclaimtemplate", "move-one")
