"""What the testing kit says of the kubelet, observed on the real one and on FakeKubelet, side by side.

Each scenario is played by bare gRPC plugins (tests/e2e/raw_plugins.py) against the real
kubelet of e2e/node and, at the same time, against a FakeKubelet in a directory of its own;
the test asserts what both must show and that they show the same (paths written as
placeholders). Names carry this process's PID: the real kubelet remembers resources and drivers
for the whole session.
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from devplug.testing import FakeKubelet
from tests.e2e.node_kit import Node, localnode
from tests.e2e.raw_plugins import (
    Calls,
    DevicePlugin,
    Dra,
    HealthV1,
    HealthV1alpha1,
    Registration,
    accepts_connections,
    plugin_info,
    register,
    serving,
)
from tests.support import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

T = TypeVar("T")
OLDER = "FakeKubelet is kubelet 1.37; this behaviour changed in 1.37 (docs/compatibility.md)"
TAG = f"observed-{os.getpid()}"
# Where the real kubelet sees its own directories (its mount namespace binds KUBELET_ROOT there).
REAL_ROOT_VIEW = "/var/lib/kubelet"


@dataclass
class Kubelet:
    """One kubelet under observation: its directories and how to restart it."""

    name: str  # "real" or "fake"
    root: Path
    restart: Callable[[], Awaitable[None]]
    fake: FakeKubelet | None = None
    node: Node | None = None

    @property
    def device_plugins(self) -> Path:
        return self.root / "device-plugins"

    @property
    def registry(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        path = self.root / "plugins" / TAG
        path.mkdir(parents=True, exist_ok=True)
        return path

    def normal(self, text: str) -> str:
        """``text`` with this kubelet's directories as placeholders (either view of the root)."""
        text = text.replace(str(self.root), "<root>")
        return text.replace(REAL_ROOT_VIEW, "<root>")

    async def allocatable(self, resource: str) -> int:
        if self.fake is not None:
            return self.fake.allocatable(resource)
        assert self.node is not None
        return await anyio.to_thread.run_sync(self.node.allocatable, resource)


@asynccontextmanager
async def fake_kubelet() -> AsyncIterator[Kubelet]:
    # A short root of its own: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dpobs-") as tmp:
        root = Path(tmp)
        kubelet = FakeKubelet(
            root / "device-plugins", plugins_registry_dir=root / "plugins_registry", dra=True
        )
        async with kubelet:
            yield Kubelet("fake", root, kubelet.restart, fake=kubelet)


def identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime in ns) of ``path``: a new file differs even where the inode is reused."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_ctime_ns


def real_kubelet(node: Node) -> Kubelet:
    async def restart() -> None:
        socket_path = node.kubelet_root / "device-plugins" / "kubelet.sock"
        before = identity(socket_path)
        await anyio.to_thread.run_sync(node.restart, "kubelet")
        kubelet = localnode.Node(node.run).processes()["kubelet"]

        def up() -> bool:
            # A new kubelet that exits while starting is named as such, with its log.
            assert localnode.alive(kubelet), f"the restarted kubelet exited; log: {kubelet['log']}"
            # A new file, listening: the old kubelet's listener may accept connections for a
            # moment after its process reads as gone (its last threads are still exiting).
            return identity(socket_path) not in (None, before) and accepts_connections(socket_path)

        await wait_until(up, timeout=60, interval=0.02, what="the new kubelet's kubelet.sock")
        await anyio.to_thread.run_sync(node.wait_ready)

    return Kubelet("real", node.kubelet_root, restart, node=node)


async def on_both(node: Node, scenario: Callable[[Kubelet], Awaitable[T]]) -> dict[str, T]:
    """Play ``scenario`` against the real kubelet and a FakeKubelet at once; results by kubelet."""
    results: dict[str, T] = {}
    async with fake_kubelet() as fake:

        async def play(kubelet: Kubelet) -> None:
            results[kubelet.name] = await scenario(kubelet)

        async with anyio.create_task_group() as tg:
            tg.start_soon(play, real_kubelet(node))
            tg.start_soon(play, fake)
    return results


async def has_allocatable(k: Kubelet, resource: str, count: int) -> bool:
    return await k.allocatable(resource) == count


# -- the plugin watcher ---------------------------------------------------------------------------


async def test_get_info_has_one_second_and_failures_are_retried_in_reconciler_rounds(node: Node) -> None:
    """GetInfo gets 1 s; a failed attempt is retried after 500 ms, 1 s, 2 s of back-off, at the
    reconciler's next round (once a second); a new socket waits for a round too."""

    async def scenario(k: Kubelet) -> dict[str, Any]:
        calls = Calls()
        endpoint = k.plugins / "getinfo.sock"
        info = plugin_info("DRAPlugin", f"getinfo.{TAG}.example.com", str(endpoint), ["v1.DRAPlugin"])
        async with serving(endpoint, Dra(calls, {}, "v1")):
            created = time.monotonic()
            registration = Registration(calls, info, delays=[1.3, 1.3, 1.3, 0.7])
            async with serving(k.registry / f"getinfo-{TAG}.sock", registration):
                await calls.wait("Notify", within=30)
        times = calls.times("GetInfo")
        return {
            "first": times[0] - created,
            "gaps": [b - a for a, b in pairwise(times)],
            "notify": calls.details("Notify"),
        }

    seen = await on_both(node, scenario)
    for name, got in seen.items():
        assert 0 <= got["first"] <= 1.15, (name, got)
        # Three answers after the 1 s deadline, then one at 0.7 s that counts: one Notify.
        assert got["notify"] == [(True, "")], (name, got)
        assert len(got["gaps"]) == 3, (name, got)
        for i, gap in enumerate(got["gaps"]):
            backoff = 0.5 * 2**i
            assert 1 + backoff - 0.05 <= gap <= 1 + backoff + 1.25, (name, i, got)
            assert abs(gap - round(gap)) < 0.2, (name, i, got)  # whole rounds of the reconciler


async def test_the_health_service_opened_and_the_refusals_in_the_kubelets_words(node: Node) -> None:
    """1.37 opens the newest DRAResourceHealth service the plugin advertises, none when it
    advertises none; a registration it refuses is told why, and tried again."""
    if node.minor < 37:
        pytest.skip(OLDER)
    cases: dict[str, tuple[str, list[str]]] = {
        "none": ("DRAPlugin", ["v1.DRAPlugin"]),
        "alpha": ("DRAPlugin", ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]),
        "both": ("DRAPlugin", ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"]),
        "unknown-service": ("DRAPlugin", ["v9.DRAPlugin"]),
        "unknown-type": ("NoSuchPlugin", ["v1"]),
        "dp-version": ("DevicePlugin", ["v1alpha1"]),
    }

    async def one(k: Kubelet, case: str, results: dict[str, Any]) -> None:
        kind, versions = cases[case]
        calls = Calls()
        endpoint = k.plugins / f"{case}.sock"
        name = f"{case}.{TAG}.example.com" if kind == "DRAPlugin" else f"{TAG}.example.com/{case}"
        info = plugin_info(kind, name, str(endpoint), versions)
        servicers = (Dra(calls, {}, "v1"), HealthV1(calls), HealthV1alpha1(calls))
        async with serving(endpoint, *servicers):
            async with serving(k.registry / f"{case}-{TAG}.sock", Registration(calls, info)):
                await calls.wait("Notify", within=30)
                if calls.details("Notify")[0][0]:
                    await anyio.sleep(2)  # time for a health stream to open
                else:
                    await calls.wait("Notify", 2, within=30)  # refused: tried again
        results[case] = {
            "notify": [
                (ok, k.normal(error).replace(TAG, "<tag>")) for ok, error in calls.details("Notify")[:2]
            ],
            "health": sorted(rpc for _, rpc, _ in calls.log if rpc.endswith("NodeWatchResources")),
        }

    async def scenario(k: Kubelet) -> dict[str, Any]:
        results: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            for case in cases:
                tg.start_soon(one, k, case, results)
        return results

    seen = await on_both(node, scenario)
    real = seen["real"]
    assert real["none"]["health"] == []
    assert real["alpha"]["health"] == ["v1alpha1.NodeWatchResources"]
    assert real["both"]["health"] == ["v1.NodeWatchResources"]
    for case in ("none", "alpha", "both"):
        assert real[case]["notify"][0] == (True, "")
    assert real["unknown-service"]["notify"][0] == (
        False,
        "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of "
        "DRA driver plugin unknown-service.<tag>.example.com at endpoint <root>/plugins/<tag>/"
        'unknown-service.sock: none of services supported by the plugin (["v9.DRAPlugin"]) are '
        'supported by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])',
    )
    assert real["unknown-type"]["notify"][0] == (
        False,
        "RegisterPlugin error -- no handler registered for plugin type: NoSuchPlugin at socket "
        "<root>/plugins_registry/unknown-type-<tag>.sock",
    )
    assert real["dp-version"]["notify"][0] == (
        False,
        "RegisterPlugin error -- plugin validation failed with err: manager version, v1beta1, "
        "is not among plugin supported versions [v1alpha1]",
    )
    for case in ("unknown-service", "unknown-type", "dp-version"):
        assert real[case]["notify"][1] == real[case]["notify"][0]
    assert seen["fake"] == real


async def test_prepare_goes_to_the_first_service_of_the_plugins_list_that_the_kubelet_knows(
    node: Node,
) -> None:
    """A plugin listing v1beta1 before v1 is called on v1beta1, for prepare and unprepare."""
    driver = f"order.{TAG}.example.com"

    async def scenario(k: Kubelet) -> list[str]:
        calls = Calls()
        endpoint = k.plugins / "order.sock"
        info = plugin_info("DRAPlugin", driver, str(endpoint), ["v1beta1.DRAPlugin", "v1.DRAPlugin"])
        devices = {"order-claim": ("req", node.name, "dev-0")}
        async with (
            serving(endpoint, Dra(calls, devices, "v1"), Dra(calls, devices, "v1beta1")),
            serving(k.registry / f"order-{TAG}.sock", Registration(calls, info)),
        ):
            await calls.wait("Notify", within=30)
            if k.fake is not None:
                claim = ("default", "order-claim", "uid-1")
                await k.fake.prepare(driver, [claim])
                await k.fake.unprepare(driver, [claim])
            else:
                await anyio.to_thread.run_sync(pod_with_a_claim, node, driver)
                await calls.wait("v1beta1.NodeUnprepareResources", within=60)
        return [rpc for _, rpc, _ in calls.log if "prepare" in rpc.lower()]

    seen = await on_both(node, scenario)
    assert seen["real"] == ["v1beta1.NodePrepareResources", "v1beta1.NodeUnprepareResources"]
    assert seen["fake"] == seen["real"]


def pod_with_a_claim(node: Node, driver: str) -> None:
    """A one-device slice of ``driver``, a class, a claim and a pod that runs with it, then deleted."""
    node.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{driver}-slice"},
            "spec": {
                "driver": driver,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev-0"}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "order-claim", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": driver}}]}},
        },
    )
    try:
        node.run_pod(
            "order-pod", claims=[{"name": "c", "resourceClaimName": "order-claim"}], command="sleep 3600"
        )
    finally:
        node.delete("pod", "order-pod")
        node.delete("resourceclaim", "order-claim")
        node.kubectl("delete", "deviceclass", driver, "--ignore-not-found")
        node.kubectl("delete", "resourceslice", f"{driver}-slice", "--ignore-not-found")


# -- device plugins: Register on kubelet.sock -----------------------------------------------------


async def test_register_dials_back_before_it_answers(node: Node) -> None:
    """Register returns once the kubelet has dialled the plugin and asked its options (a server
    that comes up late is waited for, within 10 s); the stream opens after."""
    resource = f"{TAG}.example.com/late"

    async def scenario(k: Kubelet) -> dict[str, Any]:
        calls = Calls()
        endpoint = k.device_plugins / f"late-{TAG}.sock"

        async def serve_late() -> None:
            await anyio.sleep(1.5)
            calls.add("serving")
            async with serving(endpoint, DevicePlugin(calls)):
                await calls.wait("ListAndWatch")

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_late)
            took, error = await register(k.device_plugins / "kubelet.sock", resource, endpoint.name)
            calls.add("Register returned")
        never_took, never_error = await register(
            k.device_plugins / "kubelet.sock", f"{TAG}.example.com/never", f"never-{TAG}.sock"
        )
        order = [rpc for _, rpc, _ in calls.log if rpc != "ListAndWatch ended"]
        return {"took": took, "error": error, "order": order, "never": (never_took, never_error)}

    seen = await on_both(node, scenario)
    for name, got in seen.items():
        assert got["error"] == "", (name, got)
        assert got["took"] >= 1.5, (name, got)
        order = got["order"]
        assert order[:2] == ["serving", "GetDevicePluginOptions"], (name, got)
        assert order.index("GetDevicePluginOptions") < order.index("Register returned"), (name, got)
        assert "ListAndWatch" in order, (name, got)
        took, error = got["never"]
        assert error == "failed to dial device plugin: context deadline exceeded", (name, got)
        assert 9.9 <= took <= 11.5, (name, got)


async def test_one_resource_on_two_paths_and_one_path_registered_twice(node: Node) -> None:
    """Kubelet 1.37: a second socket path for a resource takes over and the first stays
    connected; a path that registers again while connected is refused, and stays refused after
    its plugin went (the kubelet no longer notices that connection's end)."""
    if node.minor < 37:
        pytest.skip(OLDER)
    two, twice = f"{TAG}.example.com/two", f"{TAG}.example.com/twice"

    async def scenario(k: Kubelet) -> dict[str, Any]:
        kubelet_sock = k.device_plugins / "kubelet.sock"
        a, b, c = Calls(), Calls(), Calls()
        out: dict[str, Any] = {}
        async with (
            serving(k.device_plugins / f"two-a-{TAG}.sock", DevicePlugin(a, 2, "a")),
            serving(k.device_plugins / f"two-b-{TAG}.sock", DevicePlugin(b, 3, "b")),
        ):
            out["a"] = (await register(kubelet_sock, two, f"two-a-{TAG}.sock"))[1]
            await a.wait("ListAndWatch")
            out["b"] = (await register(kubelet_sock, two, f"two-b-{TAG}.sock"))[1]
            await b.wait("ListAndWatch")
            # the node status follows within its update period
            await wait_until(
                lambda: has_allocatable(k, two, 3), timeout=60, interval=0.02, what=f"{two} allocatable = 3"
            )
            out["a streams"] = (a.count("ListAndWatch"), a.count("ListAndWatch ended"))
        path = k.device_plugins / f"twice-{TAG}.sock"
        async with serving(path, DevicePlugin(c)):
            out["first"] = (await register(kubelet_sock, twice, path.name))[1]
            await c.wait("ListAndWatch")
            out["again"] = k.normal((await register(kubelet_sock, twice, path.name))[1])
            out["options asked"] = c.count("GetDevicePluginOptions")
        await c.wait("ListAndWatch ended")
        async with serving(path, DevicePlugin(Calls())):
            out["after it went"] = k.normal((await register(kubelet_sock, twice, path.name))[1])
        return out

    seen = await on_both(node, scenario)
    real = seen["real"]
    already = f"device plugin already connected: <root>/device-plugins/twice-{TAG}.sock"
    assert real == {
        "a": "",
        "b": "",
        "a streams": (1, 0),
        "first": "",
        "again": already,
        "options asked": 2,
        "after it went": already,
    }
    assert seen["fake"] == real


async def test_a_restarting_kubelet_removes_the_sockets_and_nothing_else(node: Node) -> None:
    """Every socket of the device-plugin directory goes, live or dead; files and directories
    stay, and so does the checkpoint; kubelet.sock is made afresh."""

    async def scenario(k: Kubelet) -> dict[str, Any]:
        d = k.device_plugins
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(str(d / f"dead-{TAG}.sock"))
        dead.close()
        (d / f"note-{TAG}.txt").write_text("kept\n")
        (d / f"dir-{TAG}").mkdir(exist_ok=True)
        async with serving(d / f"live-{TAG}.sock", DevicePlugin(Calls())):
            await k.restart()
            ours = sorted(p.name.replace(TAG, "<tag>") for p in d.iterdir() if TAG in p.name)
            kubelet_sock = (d / "kubelet.sock").lstat()
        (d / f"note-{TAG}.txt").unlink()
        (d / f"dir-{TAG}").rmdir()
        return {"ours": ours, "kubelet.sock is a socket": stat.S_ISSOCK(kubelet_sock.st_mode)}

    seen = await on_both(node, scenario)
    assert seen["real"] == {"ours": ["dir-<tag>", "note-<tag>.txt"], "kubelet.sock is a socket": True}
    assert seen["fake"] == seen["real"]
