"""``devplug kubelet --dra``: a fake kubelet and API server to try a DRA driver against.

A :class:`~devplug.testing.FakeKubeAPI` (HTTP on 127.0.0.1, with the node) and a
:class:`~devplug.testing.FakeKubelet` in DRA mode, whose plugin watcher serves
``ROOT/plugins_registry``, run until Ctrl-C or SIGTERM. It prints the commands that start a
driver against them first, then what the kubelet and the API server learn, one line each:
DRA registrations (accepted or refused, with the kubelet's text), each driver's published
pool (its devices, their changes, taints added and removed), the kubelet's health of the
devices, a driver losing its connection or going away, and the claims it allocates and
prepares (:mod:`devplug.cli.kubelet.claims`). Each accepted registration is followed by the
commands for that driver: inspect it, prepare a claim with ``devplug claim``. The
device-plugin side is served too (``ROOT/device-plugins/kubelet.sock``) and told as
``devplug kubelet --dir`` tells it. On the way out ``kubelet.sock`` is removed; the kubeconfig
stays, and the next run on ROOT serves the same address (:mod:`devplug.cli.kubelet.guard`);
the drivers' sockets, slices' state and CDI files are theirs.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, TextIO

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from pathlib import Path

    from devplug.testing import DraRegistration, FakeKubeAPI, FakeKubelet

Pool = dict[str, tuple[str, ...]]
"""A driver's published devices on the node: device name → its taints (``key:effect``)."""
Health = dict[tuple[str, str], str]
"""The kubelet's health of a driver's devices: ``(pool, device)`` → state."""
Instances = tuple[tuple[str, bool], ...]
"""A driver's registered instances: DRA endpoint, connected."""

_SHOWN = 12
"""Device names listed in a pool's line; more are counted."""


def driver_commands(root: Path, node: str, kubeconfig: Path) -> list[str]:
    """The lines that tell how to start a driver against this kubelet, and what to do with it."""
    common = [
        "--kubelet-root", str(root), "--node-name", node,
        "--kubeconfig", str(kubeconfig), "--cdi-dir", str(root / "cdi"),
    ]  # fmt: skip
    fake = shlex.join(["devplug-fake", "--api", "dra", *common])
    run = shlex.join(["devplug", "run", "--api", "dra", "MODULE:CLASS", *common])
    return [
        "start a DRA driver against it:",
        f"  {fake}",
        f"  {run}",
        "each driver's registration is followed by the commands that inspect it and prepare a claim",
    ]


def driver_hints(root: Path, driver: str) -> list[str]:
    """The commands for a driver that has just registered: inspect it, prepare a claim, delete it."""
    dra_socket = shlex.join(["devplug", "inspect", str(root / "plugins" / driver / "dra.sock")])
    claim = ["devplug", "kubelet", "claim", "--kubelet-root", str(root)]
    return [
        f"  inspect it: {dra_socket}",
        f"  prepare a claim: {shlex.join([*claim, '--driver', driver, 'NAME'])} (--device DEVICE to choose)",
        f"  unprepare and delete it: {shlex.join([*claim, '--delete', 'NAME'])}",
    ]


async def serve_dra(
    api: FakeKubeAPI,
    kubelet: FakeKubelet,
    root: Path,
    kubeconfig: Path,
    out: TextIO,
    *,
    follow_devices: Callable[[FakeKubelet, TextIO], Coroutine[Any, Any, None]],
    last_port: int = 0,
) -> None:
    """Serve ``api`` and ``kubelet`` (not started yet) until SIGINT / SIGTERM (devplug's handler:
    before serving, the start is cancelled and Interrupted raised), telling what happens.

    ``follow_devices`` tells the device-plugin side (``devplug kubelet``'s own follower);
    ``last_port`` is the API server's port in the kubeconfig of the last run on the root (0:
    none), told when it could not be kept. The kubeconfig stays on the way out, for the next run.
    """
    from devplug._runtime.signals import until_signalled
    from devplug.cli.kubelet.claims import follow_claims

    node = kubelet.node_name

    async def follow_all() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow_devices, kubelet, out)
            tg.start_soon(follow_dra, kubelet, root, out)
            tg.start_soon(follow_pools, api, node, out)
            tg.start_soon(follow_claims, api, kubelet, node, out)

    async with api:
        api.add_node(node)
        async with kubelet:  # it makes ROOT and its directories, as a kubelet does
            api.write_kubeconfig(kubeconfig)
            for line in driver_commands(root, node, kubeconfig):
                say(out, line)
            say(out, f"API server {api.url} with node {node}; kubeconfig {kubeconfig}")
            if last_port and not api.url.endswith(f":{last_port}"):
                say(
                    out,
                    f"the last run's port {last_port} is taken: restart drivers started against it "
                    "(they read the kubeconfig once)",
                )
            say(out, f"kubelet serving {kubelet.socket_path}")
            say(out, f"plugin watcher (DRA) on {kubelet.plugins_registry_dir}")
            say(out, "Ctrl-C to stop")
            await until_signalled(follow_all)
    say(
        out,
        f"stopped; {kubelet.socket_path.name} removed, {kubeconfig.name} kept for the next run on this root",
    )


# -- the kubelet's side ---------------------------------------------------------------------------


async def follow_dra(kubelet: FakeKubelet, root: Path, out: TextIO) -> None:
    """Print every DRA registration (an accepted one with :func:`driver_hints`), instance and
    health change of ``kubelet``, for ever."""
    seen = 0
    instances: dict[str, Instances] = {}
    health: dict[str, Health] = {}
    while True:

        def changed(
            seen: int = seen, instances: dict[str, Instances] = instances, health: dict[str, Health] = health
        ) -> bool:
            return len(kubelet.dra_registrations) != seen or _state(kubelet) != (instances, health)

        try:
            # A device's health turns Unknown with time alone: look again every second.
            await kubelet.wait_for_dra(changed, timeout=1.0)
        except TimeoutError:
            continue
        for registration in kubelet.dra_registrations[seen:]:
            say(out, dra_registration_line(registration))
            if registration.accepted:
                for line in driver_hints(root, registration.driver):
                    say(out, line)
        seen = len(kubelet.dra_registrations)
        now_instances, now_health = _state(kubelet)
        for driver in sorted(instances.keys() | now_instances.keys()):
            for line in instance_lines(
                driver, instances.get(driver, ()), now_instances.get(driver, ()), kubelet.wipe_delay
            ):
                say(out, line)
        for driver in sorted(health.keys() | now_health.keys()):
            for line in health_lines(driver, health.get(driver, {}), now_health.get(driver, {})):
                say(out, line)
        instances, health = now_instances, now_health


def _state(kubelet: FakeKubelet) -> tuple[dict[str, Instances], dict[str, Health]]:
    drivers = kubelet.dra_drivers
    instances = {d: tuple((i.endpoint, i.connected) for i in found) for d, found in drivers.items()}
    health: dict[str, Health] = {}
    for driver in drivers:
        view = kubelet.health(driver)
        messages = kubelet.health_messages(driver)
        if view:
            # Why a device is not Healthy goes with its state: "Unhealthy (XID 79: ...)".
            health[driver] = {
                key: f"{state} ({messages[key]})" if state != "Healthy" and messages.get(key) else state
                for key, state in view.items()
            }
    return instances, health


def dra_registration_line(registration: DraRegistration) -> str:
    """One DRA registration attempt as a line: the driver, its DRA socket and service, or the refusal."""
    socket = registration.socket.rpartition("/")[2]
    if not registration.accepted:
        return f"refused DRA plugin {registration.driver or socket}: {registration.error}"
    return (
        f"registered DRA driver {registration.driver} (plugin watcher, {socket}) on "
        f"{registration.endpoint}; service {registration.service}"
    )


def instance_lines(driver: str, before: Instances, after: Instances, wipe_delay: float = 30.0) -> list[str]:
    """What changed in a driver's instances: connections made or lost, instances gone."""
    lines = []
    now = dict(after)
    for endpoint, _ in before:
        if endpoint not in now:
            left = len(after)
            lines.append(f"{driver}: {endpoint} deregistered (its registration socket is gone); {left} left")
    for endpoint, connected in after:
        was = dict(before).get(endpoint)
        if connected and not was:
            lines.append(f"{driver}: connected to {endpoint}")
        elif was and not connected:
            lines.append(f"{driver}: connection to {endpoint} lost")
    usable_before = any(c for _, c in before)
    if usable_before and not any(c for _, c in after):
        lines.append(
            f"{driver}: no instance connected; its slices are deleted in {wipe_delay:g} s unless one connects"
        )
    return lines


def health_lines(driver: str, before: Health, after: Health) -> list[str]:
    """What changed in the kubelet's health of a driver's devices (none when nothing did)."""
    if not after:
        return [f"{driver} health: stream ended; the kubelet forgot its devices' health"] if before else []
    if not before:
        healthy = sum(h == "Healthy" for h in after.values())
        lines = [f"{driver} health: {_count(len(after))}, {healthy} healthy"]
        lines += [f"{driver} health: {_device(k)} {h}" for k, h in sorted(after.items()) if h != "Healthy"]
        return lines
    lines = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if old != new:
            lines.append(f"{driver} health: {_device(key)} {old or 'unreported'} -> {new or 'unreported'}")
    return lines


def _device(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


# -- the API server's side --------------------------------------------------------------------------


async def follow_pools(api: FakeKubeAPI, node: str, out: TextIO) -> None:
    """Print every change of the node's published pools (one per driver), for ever."""
    pools: dict[str, Pool] = {}
    while True:

        def changed(pools: dict[str, Pool] = pools) -> bool:
            return _pools(api, node, pools) != pools

        try:
            await api.wait_for(changed, timeout=3600)
        except TimeoutError:
            continue
        now = _pools(api, node, pools)
        for driver in sorted(pools.keys() | now.keys()):
            for line in pool_lines(driver, pools.get(driver), now.get(driver)):
                say(out, line)
        pools = now


def _pools(api: FakeKubeAPI, node: str, last: dict[str, Pool]) -> dict[str, Pool]:
    """The node's complete pools by driver; a pool in the middle of an update keeps its last state."""
    by_driver: dict[str, list[dict[str, Any]]] = {}
    for item in api.slices(node=node):
        by_driver.setdefault(str(item["spec"]["driver"]), []).append(item)
    pools: dict[str, Pool] = {}
    for driver, slices in by_driver.items():
        pool = complete_pool(slices)
        if pool is not None:
            pools[driver] = pool
        elif driver in last:
            pools[driver] = last[driver]
    return pools


def complete_pool(slices: list[dict[str, Any]]) -> Pool | None:
    """The pool's devices when its newest generation is complete (as the scheduler reads a pool)."""
    newest = max(s["spec"]["pool"]["generation"] for s in slices)
    current = [s["spec"] for s in slices if s["spec"]["pool"]["generation"] == newest]
    if any(spec["pool"]["resourceSliceCount"] != len(current) for spec in current):
        return None
    pool: Pool = {}
    for spec in current:
        for device in spec.get("devices") or ():
            taints = device.get("taints") or ()
            pool[device["name"]] = tuple(sorted(f"{t['key']}:{t['effect']}" for t in taints))
    return pool


def pool_lines(driver: str, before: Pool | None, after: Pool | None) -> list[str]:
    """What changed in a driver's pool on the node (none when nothing did)."""
    if after is None:
        return [f"{driver} pool: deleted (no slices of the node left)"] if before is not None else []
    lines = []
    if before is None or before.keys() != after.keys():
        names = sorted(after)
        shown = ", ".join(names[:_SHOWN]) + (
            f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
        )
        lines.append(f"{driver} pool: {_count(len(names))}{': ' if names else ''}{shown}")
        if before is not None:
            added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
            if added:
                lines.append(f"{driver} pool: added {', '.join(added)}")
            if removed:
                lines.append(f"{driver} pool: removed {', '.join(removed)}")
    for name in sorted(after):
        old = set(before.get(name, ()) if before is not None else ())
        new = set(after[name])
        lines += [f"{driver} pool: {name} tainted {t}" for t in sorted(new - old)]
        if before is not None and name in before:
            lines += [f"{driver} pool: {name} taint {t} removed" for t in sorted(old - new)]
    return lines


def say(out: TextIO, line: str) -> None:
    print(line, file=out, flush=True)


def _count(n: int) -> str:
    return f"{n} device{'s' if n != 1 else ''}"
