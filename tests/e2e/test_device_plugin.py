"""The device-plugin API against the real kubelet and containerd of e2e/node.

Each test uses a resource name of its own, so that what one test leaves in the node's status
(the kubelet keeps a resource's capacity after its plugin goes) never answers another's wait.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.node_kit import (
    Node,
    device_nodes,
    events,
    log_of,
    noop_hook,
    plugin_process,
    stop_process,
    wait_for,
    wait_streaming,
)

pytestmark = pytest.mark.timeout(300)


def fake_plugin(node: Node, tmp: Path, resource: str, *extra: str):  # type: ignore[no-untyped-def]
    return plugin_process(
        node,
        tmp,
        "devplug-fake",
        "--kubelet-root",
        str(node.kubelet_root),
        "--resource",
        resource,
        "--count",
        "4",
        "--log-format",
        "json",
        *extra,
    )


def test_a_pod_gets_what_allocate_gave_device_specs_and_cdi(node: Node, tmp_path: Path) -> None:
    """Device specs reach the container through the kubelet, CDI devices through containerd."""
    specs, cdi = "e2e.example.com/specs", "e2e.example.com/cdi"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        fake_plugin(node, tmp_path / "a", specs, "--device-specs") as a,
        fake_plugin(node, tmp_path / "b", cdi, "--cdi", "--cdi-dir", str(node.cdi_dir)) as b,
    ):
        wait_streaming(a)
        wait_streaming(b)
        node.wait_allocatable(specs, 4)
        node.wait_allocatable(cdi, 4)
        try:
            node.run_pod("dp-specs", resources={specs: 2})
            node.run_pod("dp-cdi", resources={cdi: 2})
            for pod in ("dp-specs", "dp-cdi"):
                env = node.pod_env(pod)
                nodes = device_nodes(node.logs(pod, "PATH="))
                given = env["FAKE_VISIBLE_DEVICES"].split(",")
                assert len(given) == 2, env
                # /dev/null as /dev/<id>: a device spec of Allocate's answer, or the CDI spec's node
                assert all(nodes.get(i) == (1, 3) for i in given), (given, nodes)
                assert sorted(n for n in nodes if n.startswith("fake-")) == sorted(given)
            assert "FAKE_CDI_RESOURCE" not in node.pod_env("dp-specs")
            assert node.pod_env("dp-cdi")["FAKE_CDI_RESOURCE"] == cdi  # an edit only the CDI spec carries
            spec = json.loads(next(node.cdi_dir.glob("*e2e.example.com*cdi*")).read_text())
            assert spec["kind"] == cdi
        finally:
            node.delete("pod", "dp-specs", wait=False)
            node.delete("pod", "dp-cdi")
            node.delete("pod", "dp-specs")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_kubelet_restart_registers_again_and_running_pods_stay(
    node: Node, tmp_path: Path, how: signal.Signals
) -> None:
    res = f"e2e.example.com/restart-{how.name.lower()}"
    with fake_plugin(node, tmp_path, res, "--device-specs") as plugin:
        wait_streaming(plugin)
        node.wait_allocatable(res, 4)
        try:
            before = node.run_pod("dp-before", resources={res: 1})
            assert events(plugin, "registered") == 1
            node.restart("kubelet", how)
            wait_for(
                "a registration with the new kubelet", lambda: events(plugin, "registered") >= 2, timeout=90
            )
            wait_streaming(plugin, 2)
            node.wait_ready()
            node.wait_allocatable(res, 4)
            after = node.run_pod("dp-after", resources={res: 2})
            running = node.get("pod", "dp-before")
            assert running["status"]["phase"] == "Running"
            assert running["metadata"]["uid"] == before["metadata"]["uid"]
            first = set(node.pod_env("dp-before")["FAKE_VISIBLE_DEVICES"].split(","))
            second = set(node.pod_env("dp-after")["FAKE_VISIBLE_DEVICES"].split(","))
            assert len(second) == 2
            assert not first & second, "the kubelet gave a device held by a running pod again"
            assert after["status"]["phase"] == "Running"
            # one ListAndWatch per registration, as FakeKubelet has it
            assert events(plugin, "stream_opened") == events(plugin, "registered") == 2
        finally:
            node.delete("pod", "dp-before", wait=False)
            node.delete("pod", "dp-after")
            node.delete("pod", "dp-before")
        assert plugin.poll() is None, log_of(plugin)


def test_plugin_restart_then_sigterm_takes_the_resource_away(node: Node, tmp_path: Path) -> None:
    res = "e2e.example.com/plugin-restart"
    with fake_plugin(node, tmp_path, res) as first:
        wait_streaming(first)
        node.wait_allocatable(res, 4)
        assert stop_process(first) == 0, log_of(first)
        node.wait_allocatable(res, 0)
    with fake_plugin(node, tmp_path, res) as second:
        wait_streaming(second)
        node.wait_allocatable(res, 4)
        try:
            node.run_pod("dp-again", resources={res: 1})
        finally:
            node.delete("pod", "dp-again")
        assert stop_process(second, signal.SIGTERM) == 0, log_of(second)
        node.wait_allocatable(res, 0)
        # the real kubelet keeps the capacity of a plugin that went (for its 5 min grace period):
        # only allocatable says the devices are gone
        assert node.capacity(res) == 4


@pytest.mark.parametrize("strategy", ["envvar", "cdi-cri"])
def test_nvidia_fake_nvml_gpus_reach_the_container(node: Node, tmp_path: Path, strategy: str) -> None:
    pod = f"gpu-{strategy}"
    with plugin_process(
        node,
        tmp_path,
        "devplug-nvidia",
        "--fake-nvml",
        "dgx-a100",
        "--kubelet-root",
        str(node.kubelet_root),
        "--device-list-strategy",
        strategy,
        "--cdi-dir",
        str(node.cdi_dir),
        "--nvidia-cdi-hook-path",
        str(noop_hook(tmp_path)),
        "--log-format",
        "json",
    ) as plugin:
        wait_streaming(plugin)
        node.wait_allocatable("nvidia.com/gpu", 8)
        try:
            node.run_pod(pod, resources={"nvidia.com/gpu": 2})
            out = node.logs(pod, "PATH=")
            env = node.pod_env(pod)
            if strategy == "envvar":
                uuids = env["NVIDIA_VISIBLE_DEVICES"].split(",")
                assert len(uuids) == 2
                assert all(u.startswith("GPU-") for u in uuids), env
            else:
                nodes = device_nodes(out)
                gpus = sorted(n for n in nodes if n.startswith("nvidia") and n[len("nvidia") :].isdigit())
                assert len(gpus) == 2, out
                assert "nvidiactl" in nodes, out
                assert env.get("NVIDIA_VISIBLE_DEVICES", "void") == "void", env
        finally:
            node.delete("pod", pod)
        assert plugin.poll() is None, log_of(plugin)
