"""The real kubelet's pod-resources API, read by devplug._runtime.podresources: the devices a
device-plugin pod was given and those of a pod's DRA claim, each with its holder."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from devplug._runtime.podresources import SOCKET, Holder, read_holders
from tests.e2e.node_kit import ROOT, Node, wait_for, wait_streaming
from tests.e2e.test_device_plugin import fake_plugin
from tests.e2e.test_dra import FAKE_DRIVER, allocated_devices, claim, fake_driver, published, without_slices

pytestmark = pytest.mark.timeout(300)


def test_the_kubelet_names_each_pod_s_devices_by_api(node: Node, tmp_path: Path) -> None:
    resource = "e2e.example.com/held"
    socket = node.kubelet_root / SOCKET
    node.kubectl("apply", "-f", str(ROOT / "deploy" / "dra" / "deviceclass.yaml"))
    without_slices(node)
    (tmp_path / "dp").mkdir()
    with fake_plugin(node, tmp_path / "dp", resource) as plugin, fake_driver(node, tmp_path):
        wait_streaming(plugin)
        node.wait_allocatable(resource, 4)
        wait_for("the driver's slices", lambda: len(published(node, FAKE_DRIVER)) == 4)
        node.apply(claim("held-claim", FAKE_DRIVER))
        try:
            node.run_pod("pr-plugin", resources={resource: 2})
            node.run_pod("pr-claim", claims=[{"name": "dev", "resourceClaimName": "held-claim"}])
            given = node.pod_env("pr-plugin")["FAKE_VISIBLE_DEVICES"].split(",")
            (claimed,) = allocated_devices(node, "pr-claim")
            holders = anyio.run(read_holders, socket)
            plugin_held = holders.of_resource(resource)
            assert sorted(plugin_held) == sorted(given)
            assert all(h == [Holder("default", "pr-plugin", "main")] for h in plugin_held.values())
            dra_held = holders.of_driver(FAKE_DRIVER, node.name)
            assert dra_held == {claimed: [Holder("default", "pr-claim", "main")]}
        finally:
            node.delete("pod", "pr-plugin", wait=False)
            node.delete("pod", "pr-claim")
            node.delete("pod", "pr-plugin")
            node.delete("resourceclaim", "held-claim")
        # Ended pods hold nothing.
        after = anyio.run(read_holders, socket)
        assert not after.of_resource(resource)
        assert not after.of_driver(FAKE_DRIVER, node.name)
