"""Chaos: a FakeKubelet and several devplug-fake processes under random, seeded disturbances.

Each round applies one disturbance (kubelet restart, clean or crashed; a plugin socket deleted;
a ListAndWatch stream killed; health flaps and devices appearing or disappearing through the
state files; concurrent Allocate calls; SIGKILL and restart of a plugin process), with state
writes and Allocate calls running next to it, then checks:

- the kubelet's table converges, within ``CONVERGE`` seconds, to each plugin's true state: the
  last state file written (all devices unhealthy while a killed stream has not been replaced:
  devplug registers again only when the kubelet restarts or its socket is deleted), and stays
  there (no stale stream overwrites it: no update is lost);
- the socket files in the directory are exactly ``kubelet.sock``, each live plugin's current
  endpoint (serving), and the sockets of SIGKILLed instances since the last kubelet restart,
  which are dead: a killed process cannot remove its socket, the next starting kubelet
  deletes it, and no live instance reuses a name (every accepted endpoint is new);
- each plugin has exactly one ListAndWatch stream open (none while its stream is killed);
- neither the test process nor a plugin process grows its file descriptors past a bound;
- no plugin process exits unless the test killed it.

``DEVPLUG_CHAOS_ROUNDS`` (default 20) sets the number of rounds, ``DEVPLUG_CHAOS_SEED`` the
seed (default: random, printed, and named in any failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from devplug import Device, KubeletError
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.support import never_within, wait_until

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("DEVPLUG_CHAOS_ROUNDS", "20"))
PLUGINS = 3
CONVERGE = 10.0
"""Seconds the kubelet's view may take to converge (a SIGKILLed plugin's restart included)."""
FD_SLACK = 12
KINDS = ("restart", "crash", "delete_socket", "kill_stream", "flap", "churn", "allocate", "sigkill")
WEIGHTS = (2, 2, 2, 1.5, 3, 2, 2, 1)
# What a concurrent Allocate may meet while a disturbance runs: the endpoint replaced or
# stopped, the connection closing, or a device that has just disappeared.
TOLERATED = {"FAILED_PRECONDITION", "UNAVAILABLE", "CANCELLED", "INVALID_ARGUMENT"}

Table = list[tuple[str, str]]


@dataclass
class Plugin:
    """One devplug-fake process (restarted after SIGKILL), its state file and what it should show."""

    index: int
    directory: Path
    dp: Path
    devices: Table = field(default_factory=list)
    detached: Table | None = None
    """The kubelet's table since its stream was killed (all unhealthy); None while attached."""
    process: Process | None = None
    incarnation: int = 0
    fd_baseline: int | None = None
    next_id: int = 0

    @property
    def resource(self) -> str:
        return f"example.com/chaos{self.index}"

    @property
    def state_file(self) -> Path:
        return self.directory / f"state{self.index}.json"

    @property
    def log(self) -> Path:
        return self.directory / f"plugin{self.index}.{self.incarnation}.log"

    def expected(self) -> Table:
        return self.detached if self.detached is not None else self.devices

    def write(self, devices: Table) -> None:
        self.devices = list(devices)
        text = json.dumps({"devices": [{"id": i, "health": h} for i, h in devices]})
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.state_file)  # atomic: the plugin never reads half a file

    def new_id(self) -> str:
        self.next_id += 1
        return f"c{self.index}-{self.next_id}"

    async def start(self) -> None:
        self.incarnation += 1
        self.fd_baseline = None
        args = [
            *("--resource", self.resource, "--state-file", str(self.state_file)),
            *("--device-plugin-dir", str(self.dp), "--log-format", "json"),
            *("--retry-initial", "0.02", "--retry-max", "0.2", "--shutdown-grace", "0.2"),
        ]
        with self.log.open("w") as log:
            self.process = await anyio.open_process(
                [sys.executable, "-m", "devplug_fake", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
            )

    def events(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for line in self.log.read_text().splitlines():
            try:
                counts[json.loads(line)["event"]] += 1
            except (ValueError, KeyError):
                continue
        return counts

    def log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-15:])
        except OSError:
            return "(no log)"


def table(devices: tuple[Device, ...]) -> Table:
    return [(d.id, d.health.value) for d in devices]


def converged_to(expected: Table) -> Callable[[tuple[Device, ...]], bool]:
    def check(devices: tuple[Device, ...]) -> bool:
        return table(devices) == expected

    return check


def sockets_in(directory: Path) -> set[str]:
    names = set()
    for entry in directory.iterdir():
        try:
            if stat.S_ISSOCK(entry.lstat().st_mode):
                names.add(entry.name)
        except FileNotFoundError:
            continue
    return names


def accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@asynccontextmanager
async def plugins_running(directory: Path, dp: Path, rng: random.Random) -> AsyncIterator[list[Plugin]]:
    plugins = [Plugin(i, directory, dp) for i in range(PLUGINS)]
    for plugin in plugins:
        plugin.write([(plugin.new_id(), "Healthy") for _ in range(rng.randint(1, 4))])
        await plugin.start()
    try:
        yield plugins
    finally:
        for plugin in plugins:
            if plugin.process is not None and plugin.process.returncode is None:
                signal_child(plugin.process, signal.SIGKILL)
            if plugin.process is not None:
                with anyio.move_on_after(5, shield=True):
                    await plugin.process.aclose()


class Chaos:
    """The disturbances, the model of what the kubelet should show, and the invariant checks."""

    def __init__(self, kubelet: FakeKubelet, plugins: list[Plugin], rng: random.Random) -> None:
        self.kubelet = kubelet
        self.plugins = plugins
        self.rng = rng
        self.stale: set[str] = set()
        """Sockets of SIGKILLed instances that no kubelet restart has removed yet."""
        self.history: list[str] = []
        self.timings: dict[str, list[float]] = {}
        self.allocations = 0
        self.reregistering: dict[str, int] = {}
        """Resources that must register again (socket deleted, process killed): the count to reach."""
        self.fd_baseline: int | None = None
        self.task_baseline: int | None = None

    # -- disturbances --------------------------------------------------------------------------

    async def disturb(self, kind: str) -> None:
        rng = self.rng
        target = rng.choice(self.plugins)
        detail = ""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.allocate_storm, rng.randint(2, 6), False)
            if kind in ("restart", "crash", "sigkill") and rng.random() < 0.5:
                # A state write while the kubelet or the plugin is away must not be lost.
                other = rng.choice(self.plugins)
                if kind in {"restart", "crash"} or other is not target:
                    tg.start_soon(self.flap, other)
            if kind == "restart":
                downtime = rng.choice((0.0, rng.uniform(0.0, 0.1)))
                self.reattach_all()
                await self.kubelet.restart(downtime=downtime)
                detail = f"downtime={downtime:.3f}"
            elif kind == "crash":
                downtime = rng.uniform(0.05, 0.3)
                self.reattach_all()
                await self.kubelet.restart(crash=True, downtime=downtime)
                detail = f"downtime={downtime:.3f}"
            elif kind == "delete_socket":
                endpoint = Path(self.kubelet.resource(target.resource).endpoint)
                self.expect_registration(target)
                target.detached = None
                endpoint.unlink()
                detail = endpoint.name
            elif kind == "kill_stream":
                if target.detached is None:
                    target.detached = [(i, "Unhealthy") for i, _ in target.devices]
                    await self.kubelet.kill_stream(target.resource)
            elif kind == "flap":
                await self.flap(target, burst=rng.randint(1, 5))
            elif kind == "churn":
                await self.churn(target)
            elif kind == "allocate":
                await self.allocate_storm(rng.randint(8, 24), True)
            elif kind == "sigkill":
                await self.sigkill(target)
        self.history.append(f"{kind}({target.resource}{', ' + detail if detail else ''})")

    def expect_registration(self, plugin: Plugin) -> None:
        accepted = sum(r.accepted and r.resource == plugin.resource for r in self.kubelet.registrations)
        self.reregistering[plugin.resource] = accepted + 1

    def reattach_all(self) -> None:
        # A restarting kubelet deletes every socket and every plugin registers again.
        for plugin in self.plugins:
            plugin.detached = None
        self.stale.clear()

    async def flap(self, plugin: Plugin, burst: int = 1) -> None:
        for _ in range(burst):
            devices = list(plugin.devices)
            for n in self.rng.sample(range(len(devices)), min(len(devices), self.rng.randint(1, 2))):
                device_id, health = devices[n]
                devices[n] = (device_id, "Unhealthy" if health == "Healthy" else "Healthy")
            plugin.write(devices)
            await anyio.sleep(self.rng.choice((0.0, 0.002, 0.01)))

    async def churn(self, plugin: Plugin) -> None:
        devices = list(plugin.devices)
        if devices and (len(devices) > 6 or self.rng.random() < 0.5):
            for gone in self.rng.sample(devices, self.rng.randint(1, min(2, len(devices)))):
                devices.remove(gone)
        else:
            devices += [(plugin.new_id(), "Healthy") for _ in range(self.rng.randint(1, 3))]
        plugin.write(devices)

    async def sigkill(self, plugin: Plugin) -> None:
        assert plugin.process is not None
        endpoint = Path(self.kubelet.resource(plugin.resource).endpoint)
        self.expect_registration(plugin)
        signal_child(plugin.process, signal.SIGKILL)
        await plugin.process.wait()
        await plugin.process.aclose()
        # A killed process cannot remove its socket: it stays, dead, until a kubelet restarts.
        if endpoint.exists():
            self.stale.add(endpoint.name)
        plugin.detached = None
        await plugin.start()

    async def allocate_storm(self, calls: int, strict: bool) -> None:
        """Concurrent Allocate calls; with ``strict`` (a quiet moment) every one must succeed."""

        async def one(plugin: Plugin, ids: list[str]) -> None:
            try:
                allocation = await self.kubelet.allocate(plugin.resource, ids)
            except KubeletError as exc:
                if strict or exc.code not in TOLERATED:
                    raise AssertionError(f"Allocate {plugin.resource} {ids}: {exc.code} {exc}") from None
                return
            assert allocation.envs == {"FAKE_VISIBLE_DEVICES": ",".join(ids)}, allocation
            self.allocations += 1

        with anyio.fail_after(CONVERGE):
            async with anyio.create_task_group() as tg:
                for _ in range(calls):
                    candidates = [p for p in self.plugins if p.detached is None and p.devices]
                    if not candidates:
                        return
                    plugin = self.rng.choice(candidates)
                    ids = [
                        i
                        for i, _ in self.rng.sample(plugin.devices, self.rng.randint(1, len(plugin.devices)))
                    ]
                    tg.start_soon(one, plugin, ids)

    # -- invariants ----------------------------------------------------------------------------

    async def check(self, kind: str) -> None:
        started = time.monotonic()
        for resource, count in self.reregistering.items():
            # The old endpoint's table is right until its stream's end is noticed: wait for
            # the new registration, not just for the table.
            await self.kubelet.wait_for_registration(resource, count=count, timeout=CONVERGE)
        self.reregistering.clear()
        for plugin in self.plugins:
            await self.kubelet.wait_for_devices(
                plugin.resource, converged_to(plugin.expected()), timeout=CONVERGE
            )
        self.timings.setdefault(kind, []).append(time.monotonic() - started)
        # Still there: no late message from an old stream replaced the last state.
        await never_within(
            lambda: [
                p.resource
                for p in self.plugins
                if table(self.kubelet.resource(p.resource).devices) != p.expected()
            ],
            0.05,
            what="a late message replacing the converged devices",
        )
        for plugin in self.plugins:
            view = self.kubelet.resource(plugin.resource)
            assert view.connected == (plugin.detached is None), view
            assert plugin.process is not None
            assert plugin.process.returncode is None, (
                f"{plugin.resource} exited with {plugin.process.returncode}:\n{plugin.log_tail()}"
            )
        self.check_sockets()
        self.check_registrations()
        await self.check_streams()
        self.check_fds()

    def check_sockets(self) -> None:
        dp = self.kubelet.device_plugin_dir
        endpoints = {Path(self.kubelet.resource(p.resource).endpoint).name for p in self.plugins}
        assert sockets_in(dp) == {"kubelet.sock"} | endpoints | self.stale, (
            f"sockets {sorted(sockets_in(dp))}, endpoints {sorted(endpoints)}, stale {sorted(self.stale)}"
        )
        for name in endpoints:
            assert accepts(dp / name), f"endpoint {name} does not accept connections"
        for name in self.stale:
            assert not accepts(dp / name), f"the socket {name} of a killed process accepts connections"

    def check_registrations(self) -> None:
        accepted = [r.endpoint for r in self.kubelet.registrations if r.accepted]
        reused = [name for name, n in Counter(accepted).items() if n > 1]
        assert not reused, f"socket names registered more than once: {reused}"

    async def check_streams(self) -> None:
        """One ListAndWatch open per attached plugin, none for a detached one (from their logs)."""

        def open_streams() -> dict[str, int]:
            counts: dict[str, int] = {}
            for plugin in self.plugins:
                events = plugin.events()
                counts[plugin.resource] = events["stream_opened"] - events["stream_closed"]
            return counts

        wanted = {p.resource: 0 if p.detached is not None else 1 for p in self.plugins}
        await wait_until(
            lambda: open_streams() == wanted,
            timeout=3.0,
            interval=0.02,
            what=lambda: f"open streams {wanted}, not {open_streams()}",
        )

    def check_fds(self) -> None:
        count = fd_count()
        tasks = len(asyncio.all_tasks())
        if self.fd_baseline is None or self.task_baseline is None:
            self.fd_baseline, self.task_baseline = count, tasks
        assert count <= self.fd_baseline + FD_SLACK, f"test process fds {count}, first {self.fd_baseline}"
        assert tasks <= self.task_baseline + 10, f"test process tasks {tasks}, first {self.task_baseline}"
        for plugin in self.plugins:
            assert plugin.process is not None
            count = fd_count(plugin.process.pid)
            if plugin.fd_baseline is None:
                plugin.fd_baseline = count
            assert count <= plugin.fd_baseline + FD_SLACK, (
                f"{plugin.resource} fds {count}, first {plugin.fd_baseline}"
            )


def plan(rng: random.Random, rounds: int) -> list[str]:
    """Every kind once (shuffled) first, then weighted random kinds."""
    kinds = list(KINDS)
    rng.shuffle(kinds)
    kinds += rng.choices(KINDS, weights=WEIGHTS, k=max(0, rounds - len(kinds)))
    return kinds[:rounds]


def seed_from_env() -> int:
    value = os.environ.get("DEVPLUG_CHAOS_SEED")
    return int(value) if value else random.SystemRandom().randrange(2**32)


async def test_chaos(short_dir: Path) -> None:
    seed = seed_from_env()
    print(f"chaos seed {seed} (DEVPLUG_CHAOS_SEED={seed} replays it), {ROUNDS} rounds")
    rng = random.Random(seed)
    dp = short_dir / "dp"
    async with FakeKubelet(dp) as kubelet, plugins_running(short_dir, dp, rng) as plugins:
        chaos = Chaos(kubelet, plugins, rng)
        kind = "start"
        try:
            await chaos.check(kind)
            for kind in plan(rng, ROUNDS):
                await chaos.disturb(kind)
                await chaos.check(kind)
            # The end: every plugin stops on SIGTERM with status 0 and removes its socket; only the
            # sockets of killed instances remain, until the kubelet restarts.
            kind = "sigterm"
            for plugin in plugins:
                assert plugin.process is not None
                signal_child(plugin.process, signal.SIGTERM)
            for plugin in plugins:
                assert plugin.process is not None
                with anyio.fail_after(5):
                    code = await plugin.process.wait()
                assert code == 0, f"{plugin.resource} exited with {code}:\n{plugin.log_tail()}"
            assert sockets_in(dp) == {"kubelet.sock"} | chaos.stale
            await kubelet.restart()
            assert sockets_in(dp) == {"kubelet.sock"}
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            logs = "\n".join(f"--- {p.log}\n{p.log_tail()}" for p in plugins)
            raise AssertionError(
                f"chaos failed with seed {seed} at {kind} after {chaos.history[-4:]}: "
                f"{type(exc).__name__}: {exc}\n{logs}"
            ) from exc
    worst = {k: round(max(v), 3) for k, v in sorted(chaos.timings.items())}
    print(f"convergence, worst seconds by disturbance: {worst}; {chaos.allocations} allocations;")
    print(f"test process fds {fd_count()} (first {chaos.fd_baseline})")


def test_plan_covers_every_kind() -> None:
    rounds = plan(random.Random(1), 20)
    assert len(rounds) == 20 and set(rounds) == set(KINDS)
    assert plan(random.Random(7), 30) == plan(random.Random(7), 30)  # a seed replays the same run
