"""Both APIs on the real node: devplug-fake serving example.com/fake through the device plugin and
fake.example.com through DRA from one process, and a node moving from the device plugin to DRA
while the device plugin's pods run.

The random test creates pods asking ``example.com/fake`` (device plugin) and pods with a claim
(DRA), seeded (``DEVPLUG_E2E_SEED`` to repeat a run; the seed is in every failure message), each
living a random short while; every container reports its devices and the kernel's uptime when it
starts and when it ends (the pods share the host's kernel), and no device may be in two running
containers at once."""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.node_kit import ROOT, Node, events, localnode, log_of, plugin_process, wait_for, wait_streaming
from tests.e2e.test_dra import FAKE_DRIVER, allocated_devices, published, template, without_slices

pytestmark = pytest.mark.timeout(900)

RESOURCE = "example.com/fake"
HELD_TAINT = f"{FAKE_DRIVER}/device-plugin"
LIFETIMES = 200
"""Pods created, each living once."""
CONCURRENT = 6
"""Pods at most pending or running at once (4 devices: some wait)."""
BUDGET = 600.0
"""Seconds the random run may take."""
LABEL = "devplug-e2e=both-apis"
REPORT = (
    'read up _ < /proc/uptime; echo "START $up ${FAKE_VISIBLE_DEVICES:-none}"; sleep %s; '
    'read up _ < /proc/uptime; echo "END $up"'
)


def both_flags(node: Node) -> list[str]:
    flags = node.dra_flags()
    flags[flags.index("--api") + 1] = "device-plugin,dra"
    return flags


def pod(name: str, kind: str, seconds: float) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": localnode.BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", REPORT % f"{seconds:.2f}"],
    }
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if kind == "plugin":
        container["resources"] = {"limits": {RESOURCE: "1"}}
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


def phases(node: Node) -> dict[str, str]:
    items = node.get("pods", namespace="default")["items"]
    key, value = LABEL.split("=")
    return {
        p["metadata"]["name"]: p["status"].get("phase", "Pending")
        for p in items
        if p["metadata"].get("labels", {}).get(key) == value
    }


def intervals(logs: str) -> dict[str, tuple[set[str], float, float]]:
    """pod → (its devices, start, end) from ``kubectl logs --prefix`` output."""
    out: dict[str, tuple[set[str], float, float]] = {}
    for line in logs.splitlines():
        found = re.match(r"\[pod/([^/]+)/main\] (START|END) ([0-9.]+)(?: (\S+))?", line)
        if not found:
            continue
        name, what, at, devices = found.groups()
        old = out.get(name, (set(), float("nan"), float("inf")))
        if what == "START":
            out[name] = ({d for d in (devices or "").split(",") if d and d != "none"}, float(at), old[2])
        else:
            out[name] = (old[0], old[1], float(at))
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


def test_random_pods_of_both_apis_never_share_a_device(node: Node, tmp_path: Path, fake_class: str) -> None:
    seed = int(os.environ.get("DEVPLUG_E2E_SEED") or random.randrange(2**31))
    print(f"seed: {seed} (DEVPLUG_E2E_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    without_slices(node)
    clean(node)
    node.apply(template("both-one", fake_class))
    flags = [*both_flags(node), "--count", "4", "--log-format", "json", "--pod-resources-interval", "1"]
    try:
        with plugin_process(node, tmp_path, "devplug-fake", *flags) as proc:
            wait_streaming(proc)
            node.wait_allocatable(RESOURCE, 4)
            wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
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
                    name = f"both-{len(created) + len(batch):03d}-{kind}"
                    batch.append(pod(name, kind, rng.uniform(0.5, 2.5)))
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
            logs = node.kubectl("logs", "-l", LABEL, "--prefix", "--tail=-1", "--max-log-requests=20")
            assert proc.poll() is None, log_of(proc)[-3000:]
            conflicts = events(proc, "allocate_refused_held") + events(proc, "prepare_refused_held")
    finally:
        clean(node)
        node.delete("resourceclaimtemplate", "both-one")
    spans = intervals(logs)
    ran = {name: kind for name, kind in created.items() if name in spans}
    plugin_pods = sum(k == "plugin" for k in ran.values())
    summary = (
        f"seed {seed}: {len(created)} pods, {len(ran)} ran ({plugin_pods} device plugin, "
        f"{len(ran) - plugin_pods} DRA), {sum(v == 'Failed' for v in final.values())} failed, "
        f"{conflicts} conflicts refused"
    )
    print(summary)
    assert not overlaps(spans), f"{summary}: {overlaps(spans)}"
    # Each that ran had its one device, and both APIs served a good share of the pods.
    assert all(len(spans[name][0]) == 1 for name in ran), summary
    assert plugin_pods >= LIFETIMES // 4, summary
    assert len(ran) - plugin_pods >= LIFETIMES // 4, summary


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
        for name in (*names, "move-c", "move-d", "move-e"):
            node.delete("pod", name, wait=False)
        for name in (*names, "move-c", "move-d", "move-e"):
            node.delete("pod", name)
        node.delete("resourceclaimtemplate", "move-one")
