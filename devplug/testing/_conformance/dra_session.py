"""One DRA conformance run: the driver process, a FakeKubeAPI, a FakeKubelet in DRA mode, the verdicts.

The steps drive the driver the way a node and a cluster would: the kubelet's plugin watcher
registers it, the scheduler allocates a claim from its slices, the kubelet prepares and
unprepares, watches health, restarts (deleting the node's slices), and finally SIGTERM. A step
that cannot go on raises ``Stop``; the checks it would have fed are skipped with its reason.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import TYPE_CHECKING, Any

import anyio
import grpc
from asyncinotify import Inotify, Mask

from devplug._text import counted
from devplug.testing._conformance import dra_judges as judge
from devplug.testing._conformance.dra_both import BothSteps
from devplug.testing._conformance.dra_claims import CALL_TIMEOUT, ClaimSteps, Stop
from devplug.testing._conformance.dra_judges import DRA_CHECKS
from devplug.testing._kubeapi.server import FakeKubeAPI
from devplug.testing._kubelet import dra_rpc as rpc
from devplug.testing._kubelet.dra_validation import DRA_SERVICES, HEALTH_V1, HEALTH_V1ALPHA1
from devplug.testing._kubelet.kubelet import FakeKubelet, _accepts_connections
from devplug.testing._kubelet.validation import go_rpc_error
from devplug.testing._process import PluginExited, PluginProcess

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from devplug.testing._conformance.judges import CheckStatus, Outcome
    from devplug.testing._kubelet.dra_resource import DraRegistration

RESTORE_WITHIN = 5.0
"""Seconds within which wiped slices must be back."""
SIGTERM_GRACE = 2.0


class DraSession(ClaimSteps, BothSteps):
    """Runs one DRA driver command against a fresh FakeKubeAPI and FakeKubelet; collects the outcomes."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        paths: Mapping[str, Path],
        *,
        driver: str | None,
        node: str,
        timeout: float,
    ) -> None:
        self.kubelet_root, self.cdi_dir = paths["kubelet_root"], paths["cdi_dir"]
        self.kubeconfig, self.registry = paths["kubeconfig"], self.kubelet_root / "plugins_registry"
        self.driver, self.node, self.timeout = driver, node, timeout
        self.results: dict[str, Outcome] = {}
        self.plugin = PluginProcess(argv, env, paths["log"])
        self.registration: DraRegistration | None = None
        self._created: dict[str, set[str]] = {}  # registration socket -> sockets serving when it appeared
        self._api = FakeKubeAPI()
        self._kubelet = FakeKubelet(
            self.kubelet_root / "device-plugins",
            plugins_registry_dir=self.registry,
            dra=True,
            kube_api=self._api,
            node_name=node,
        )
        self._node_uid = ""
        self._allocated: list[tuple[str, str]] = []

    async def run(self) -> dict[str, Outcome]:
        """Start everything, drive and judge the driver, stop it; outcomes by check name.

        Raises:
            OSError: the command could not be started.
        """
        stopped = "an earlier step failed"
        async with self._api, self._kubelet:
            self._node_uid = self._api.add_node(self.node)["metadata"]["uid"]
            self._api.write_kubeconfig(self.kubeconfig)
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            with Inotify() as inotify:
                # Watched before the driver starts: its first registration socket is seen.
                inotify.add_watch(self.registry, Mask.CREATE | Mask.MOVED_TO)
                await self.plugin.start()
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._watch_registry, inotify)
                        tg.start_soon(self.plugin.watch)
                        try:
                            await self._register()
                            await self._versions()
                            await self._slices()
                            await self._claims()
                            await self._shares()
                            await self._both()
                            await self._health()
                            await self._wipe()
                        except (Stop, PluginExited) as stop:
                            stopped = str(stop)
                        self.results["dra_socket_first"] = self._socket_order()
                        await self._sigterm()
                        tg.cancel_scope.cancel()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.plugin.reap()
        for name in DRA_CHECKS:
            self.results.setdefault(name, ("skip", stopped))
        return self.results

    # -- registration ------------------------------------------------------------------------------

    async def _watch_registry(self, inotify: Inotify) -> None:
        # At the moment a registration socket appears, note which sockets under the kubelet root
        # already accept connections: its DRA endpoint must be one of them.
        async for event in inotify:
            path = event.path
            if (
                path is None
                or path.name.startswith(".")
                or str(path) in self._created
                or not _is_socket(path)
            ):
                continue
            self._created[str(path)] = {
                str(p)
                for p in self.kubelet_root.rglob("*")
                if p.parent != self.registry and _is_socket(p) and _accepts_connections(str(p))
            }

    def _mine(self, r: DraRegistration) -> bool:
        return r.accepted and self.driver in (None, r.driver)

    async def _register(self) -> None:
        kubelet = self._kubelet
        try:
            reg = await self.plugin.guard(
                lambda: kubelet.wait_for_dra_attempt(self._mine, timeout=self.timeout)
            )
        except (TimeoutError, PluginExited) as exc:
            failures = [r.error for r in kubelet.dra_registrations if r.error] + [
                r.error for r in kubelet.registrations if r.error
            ]
            if isinstance(exc, PluginExited):
                reason = f"{exc} before registering"
            elif failures:
                reason = f"not registered ({len(failures)} failed attempts): {failures[-1]}"
            else:
                reason = f"no registration socket was registered within {self.timeout:g} s"
            self.results["get_info"] = ("fail", reason)
            raise Stop("not registered") from None
        self.registration = reg
        self.driver = reg.driver
        self.results["get_info"] = judge.get_info(reg, self.driver)

    async def _versions(self) -> None:
        reg, driver = self.registration, self.driver
        assert reg is not None
        assert driver is not None
        try:
            instance = await self.plugin.guard(
                lambda: self._kubelet.wait_for_usable(driver, timeout=self.timeout)
            )
        except TimeoutError:
            self.results["versions"] = ("fail", f"the kubelet could not connect to {reg.endpoint}")
            raise Stop(f"no connection to {reg.endpoint}") from None
        answers: dict[str, str | None] = {}
        for service in (s for s in reg.services if s in DRA_SERVICES):
            try:
                got = await self.plugin.guard(
                    lambda: rpc.prepare(instance.channel, service, [], deadline=CALL_TIMEOUT),  # noqa: B023
                    within=CALL_TIMEOUT,
                )
            except grpc.aio.AioRpcError as exc:
                answers[service] = f"failed: {go_rpc_error(exc.code().name, exc.details() or '')}"
            except TimeoutError:
                answers[service] = f"did not answer within {CALL_TIMEOUT:g} s"
            else:
                answers[service] = (
                    None if not got else f"answered {counted(len(got), 'entry', 'entries')} instead of none"
                )
        self.results["versions"] = judge.versions(reg.services, answers)

    # -- slices --------------------------------------------------------------------------------------

    async def _wait_for_slices(
        self, within: float, old: frozenset[str] = frozenset()
    ) -> list[dict[str, Any]] | str:
        """The slices once complete, valid and none of UIDs ``old``; else what was wrong at the deadline."""
        api = self._api

        def complete(slices: list[dict[str, Any]]) -> bool:
            fresh = not any(s["metadata"]["uid"] in old for s in slices)
            return fresh and not judge.slices_problem(slices, self.node, self._node_uid)

        try:
            return await self.plugin.guard(
                lambda: api.wait_for_slices(self.node, self.driver, predicate=complete, timeout=within)
            )
        except TimeoutError:
            return judge.slices_problem(api.slices(self.node, self.driver), self.node, self._node_uid)

    async def _slices(self) -> None:
        found = await self._wait_for_slices(self.timeout)
        if isinstance(found, str):
            self.results["slices_published"] = ("fail", f"after {self.timeout:g} s: {found}")
            return
        devices = judge.published_devices(found)
        self.results["slices_published"] = (
            "pass",
            f"{counted(len(found), 'slice')}, {counted(len(devices), 'device')}",
        )

    # -- health, wipe, SIGTERM ---------------------------------------------------------------------

    async def _health(self) -> None:
        reg, driver, kubelet = self.registration, self.driver, self._kubelet
        assert reg is not None
        assert driver is not None
        if not {HEALTH_V1, HEALTH_V1ALPHA1} & set(reg.services):
            self.results["health_full_list"] = ("skip", "no health service advertised (optional)")
            return
        published = judge.published_devices(self._api.slices(self.node, driver))
        if not published:
            self.results["health_full_list"] = ("skip", "no device published")
            return
        with contextlib.suppress(TimeoutError):  # judged below from what came
            await self.plugin.guard(
                lambda: kubelet.wait_for_health(driver, lambda h: published <= set(h), timeout=self.timeout)
            )
        instance = kubelet.dra_instance(driver)
        messages = [{(r.pool, r.device) for r in m} for m in instance.health_messages]
        self.results["health_full_list"] = judge.health_full_list(messages, published, instance.health_error)

    async def _wipe(self) -> None:
        old = frozenset(s["metadata"]["uid"] for s in self._api.slices(self.node, self.driver))
        restarted = time.monotonic()
        await self._kubelet.restart()  # deletes every slice of the node, as a starting kubelet does
        found = await self._wait_for_slices(RESTORE_WITHIN, old)
        if isinstance(found, str):
            self.results["slices_restored_after_wipe"] = ("fail", f"not within {RESTORE_WITHIN:g} s: {found}")
            return
        took = time.monotonic() - restarted
        self.results["slices_restored_after_wipe"] = (
            "pass",
            f"{counted(len(found), 'slice')} recreated {took:.2f} s after a kubelet restart deleted them",
        )

    def _socket_order(self) -> Outcome:
        reg = self.registration
        if reg is None:
            return "skip", "not registered"
        if reg.endpoint == reg.socket:
            return "pass", "one socket serves both services"
        serving = self._created.get(reg.socket)
        if serving is None:
            return "skip", f"the creation of {reg.socket} was not seen"
        if not reg.endpoint.startswith(f"{self.kubelet_root}/"):
            return "skip", f"endpoint {reg.endpoint} is outside the kubelet root"
        if reg.endpoint not in serving:
            return "fail", (
                f"{reg.socket} appeared before {reg.endpoint} accepted connections: the kubelet connects "
                "at once, and a driver it cannot reach is unusable (its slices are wiped 30 s later)"
            )
        return "pass", f"{reg.endpoint} was serving when {os.path.basename(reg.socket)} appeared"

    async def _sigterm(self) -> None:
        name = "sigterm_clean"
        if self.plugin.exited.is_set():
            status: CheckStatus = "fail" if self.registration is not None else "skip"
            self.results[name] = (status, f"{self.plugin.exit_reason()} before SIGTERM")
            return
        sent = time.monotonic()
        exited = await self.plugin.terminate(SIGTERM_GRACE)
        took = time.monotonic() - sent
        mine = [r for r in self._kubelet.dra_registrations if self._mine(r)]
        left = _existing({p for r in mine for p in (r.socket, r.endpoint)})
        if not exited:
            self.results[name] = ("fail", f"still running {SIGTERM_GRACE:g} s after SIGTERM")
        elif self.plugin.returncode != 0:
            self.results[name] = ("fail", f"the driver {self.plugin.status()} on SIGTERM")
        elif left:
            self.results[name] = (
                "fail",
                f"exited {took:.2f} s after SIGTERM but left {', '.join(left)} behind",
            )
        else:
            self.results[name] = ("pass", f"exited with status 0 {took:.2f} s after SIGTERM; sockets removed")


def _existing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if os.path.exists(p))


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False
