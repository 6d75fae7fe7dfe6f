"""One conformance run: the plugin process, a fake kubelet, the calls made and what they showed.

The steps drive the plugin the way a node would (register, list, admit pods, restart the
kubelet, SIGTERM); what the fake kubelet recorded on the way is judged at the end
(:mod:`devplug.testing._conformance.judges`). A step that cannot go on raises ``_Stop``; the checks it
would have fed are then skipped with its reason.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TYPE_CHECKING

import anyio

from devplug._text import counted
from devplug.errors import KubeletError
from devplug.testing._conformance import judges as judge
from devplug.testing._conformance.judges import CHECKS, Connection, Outcome
from devplug.testing._kubelet.kubelet import FakeKubelet
from devplug.testing._kubelet.validation import KUBELET_SOCKET, join_endpoint
from devplug.testing._process import PluginExited, PluginProcess

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from devplug.testing._conformance.judges import CheckStatus
    from devplug.testing._kubelet.resource import Registration

LIST_WAIT = 3.0
"""Seconds to wait for the first message of a stream (1 s is the limit; more tells late from never)."""
CALL_TIMEOUT = 10.0
"""Seconds any one call may take (the kubelet sets no deadline on Allocate; a check must end)."""
SIGTERM_GRACE = 5.0
"""Seconds a plugin has to exit after SIGTERM (a DaemonSet pod's grace period is longer)."""


class _Stop(Exception):
    """The run cannot go on (the plugin exited, or never registered); the message says why."""


class Session:
    """Runs one plugin command against a fresh fake kubelet and collects the check outcomes."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        dp_dir: Path,
        log_path: Path,
        *,
        resource: str | None,
        timeout: float,
    ) -> None:
        self.dp_dir = dp_dir
        self.resource = resource
        self.timeout = timeout
        self.results: dict[str, Outcome] = {}
        self.connections: list[Connection] = []
        self.plugin = PluginProcess(argv, env, log_path)
        self._kubelet = FakeKubelet(dp_dir)

    async def run(self, *, restarts: int) -> dict[str, Outcome]:
        """Start the kubelet and the plugin, drive and judge it, stop both; outcomes by check name.

        Raises:
            OSError: the command could not be started.
        """
        stopped = "an earlier step failed"
        async with self._kubelet:
            await self.plugin.start()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.plugin.watch)
                    try:
                        await self._register()
                        await self._follow("first registration")
                        await self._device_calls()
                        await self._restarts(restarts)
                    except (_Stop, PluginExited) as stop:
                        stopped = str(stop)
                    self._judge()
                    await self._sigterm()
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await self.plugin.reap()
        for name in CHECKS:
            self.results.setdefault(name, ("skip", stopped))
        return self.results

    # -- the steps -----------------------------------------------------------------------------

    def _mine(self, registration: Registration) -> bool:
        return registration.via == "register" and self.resource in (None, registration.resource)

    async def _register(self) -> None:
        kubelet = self._kubelet
        try:
            reg = await self.plugin.guard(
                lambda: kubelet.wait_for_attempt(lambda r: self._mine(r) and r.accepted, timeout=self.timeout)
            )
        except (TimeoutError, PluginExited) as exc:
            attempts = [r for r in kubelet.registrations if self._mine(r)]
            if isinstance(exc, PluginExited):
                reason = f"{exc} before registering"
            elif attempts:
                reason = f"Register rejected ({counted(len(attempts), 'attempt')}): {attempts[-1].error}"
            else:
                others = sorted({r.resource for r in kubelet.registrations if r.accepted})
                seen = f" (registered: {', '.join(others)})" if others else ""
                reason = f"no Register call completed within {self.timeout:g} s{seen}"
            self.results["valid_registration"] = ("fail", reason)
            raise _Stop("not registered") from None
        self.resource = reg.resource
        rejected = [r for r in kubelet.registrations if self._mine(r) and not r.accepted]
        if "/" in reg.endpoint:
            # The kubelet joins it under its directory, but deletes only the sockets at the top
            # level on restart: a plugin watching its own socket would never see it go.
            self.results["valid_registration"] = (
                "fail",
                f"endpoint {reg.endpoint!r} is not a bare file name",
            )
            return
        note = f" after {len(rejected)} rejected attempts ({rejected[0].error})" if rejected else ""
        self.results["valid_registration"] = (
            "pass",
            f"{reg.resource} on {reg.endpoint}, {reg.version}{note}",
        )

    async def _follow(self, label: str) -> None:
        """Record the resource's connection and wait for the first message on its stream."""
        resource = self.resource
        assert resource is not None
        self.connections.append(self._connection(label))
        try:
            with contextlib.suppress(TimeoutError):  # initial_list_at_once says so
                await self.plugin.guard(lambda: self._kubelet.wait_for_devices(resource, timeout=LIST_WAIT))
        finally:
            # A plugin that registered twice in a row (two restart signals, not de-duplicated)
            # has replaced the first connection: judge the one the kubelet kept.
            latest = self._connection(label)
            if latest.endpoint is not self.connections[-1].endpoint:
                self.connections[-1] = latest

    def _connection(self, label: str) -> Connection:
        assert self.resource is not None
        endpoint = self._kubelet.resource(self.resource)._current
        directory = str(self._kubelet.device_plugin_dir)
        accepted = [r for r in self._kubelet.registrations if r.accepted and self._mine(r)]
        # The registration that made this connection: the latest one naming its socket.
        registration = next(
            (r for r in reversed(accepted) if join_endpoint(directory, r.endpoint) == endpoint.path),
            accepted[-1],
        )
        return Connection(label, registration, endpoint)

    async def _device_calls(self) -> None:
        assert self.resource is not None
        lists = self.connections[0].endpoint.raw_lists
        if not lists:
            for name in ("allocate_one_response", "unknown_ids_rejected", "preferred_allocation"):
                self.results[name] = ("skip", "no device list received")
            return
        healthy = [device_id for device_id, health, _ in lists[-1] if health == "Healthy"]
        if not healthy:
            for name in ("allocate_one_response", "preferred_allocation"):
                self.results[name] = ("skip", "no healthy device listed")
        else:
            self.results["allocate_one_response"] = await self._allocate_one(healthy[0])
            self.results["preferred_allocation"] = await self._preferred(healthy)
        self.results["unknown_ids_rejected"] = await self._unknown_rejected()

    async def _allocate_one(self, device_id: str) -> Outcome:
        resource = self.resource
        assert resource is not None
        try:
            responses = await self.plugin.guard(
                lambda: self._kubelet.allocate_raw(resource, [[device_id]]), within=CALL_TIMEOUT
            )
        except KubeletError as exc:
            return "fail", f"Allocate({device_id}) failed: {exc.code}: {exc}"
        except TimeoutError:
            return "fail", f"Allocate({device_id}) did not answer within {CALL_TIMEOUT:g} s"
        if len(responses) != 1:
            return "fail", (
                f"Allocate({device_id}) answered {len(responses)} container responses for one request "
                "(the kubelet uses the first; none fails the pod)"
            )
        return "pass", f"Allocate({device_id}) answered one container response"

    async def _unknown_rejected(self) -> Outcome:
        resource = self.resource
        assert resource is not None
        unknown = f"no-such-device-{uuid.uuid4().hex[:8]}"
        try:
            await self.plugin.guard(
                lambda: self._kubelet.allocate_raw(resource, [[unknown]]), within=CALL_TIMEOUT
            )
        except KubeletError as exc:
            if exc.code == "FAILED_PRECONDITION" and not self._kubelet.resource(resource).connected:
                return "skip", "the ListAndWatch stream had ended: the kubelet would not call Allocate"
            return "pass", f"Allocate({unknown}) failed with {exc.code}: {exc}"
        except TimeoutError:
            return "fail", f"Allocate({unknown}) did not answer within {CALL_TIMEOUT:g} s"
        return "fail", f"Allocate({unknown}) succeeded for a device the plugin never listed"

    async def _preferred(self, healthy: list[str]) -> Outcome:
        resource = self.resource
        assert resource is not None
        if not self.connections[0].endpoint.options.get_preferred_allocation_available:
            return "skip", "not offered (get_preferred_allocation_available is false)"
        # The kubelet's request: every free healthy device is available, the must-include
        # ones among them, and the size is the total count.
        cases: list[tuple[list[str], int]] = [([], 1)] + ([([healthy[-1]], 2)] if len(healthy) >= 2 else [])
        for must, size in cases:
            what = f"GetPreferredAllocation(size={size}, must_include={must})"
            try:
                chosen = await self.plugin.guard(
                    lambda: self._kubelet.preferred_allocation(resource, healthy, must, size),  # noqa: B023
                    within=CALL_TIMEOUT,
                )
            except KubeletError as exc:
                return "fail", f"{what} failed: {exc.code}: {exc} (an error fails pod admission)"
            except TimeoutError:
                return "fail", f"{what} did not answer within {CALL_TIMEOUT:g} s"
            problem = judge.preferred_problem(chosen, healthy, must, size)
            if problem:
                return "fail", f"{what} answered {chosen}: {problem}"
        return "pass", f"honoured must-include and size in {counted(len(cases), 'request')}"

    async def _restarts(self, count: int) -> None:
        assert self.resource is not None
        resource = self.resource
        kubelet = self._kubelet
        if count < 1:
            self.results["re_registers_after_restart"] = ("skip", "no kubelet restart asked for")
            return
        took: list[float] = []
        for n in range(1, count + 1):
            before = sum(r.accepted for r in kubelet.registrations if r.resource == resource)
            restarted = time.monotonic()
            await kubelet.restart()
            try:
                reg = await self.plugin.guard(
                    lambda: kubelet.wait_for_registration(resource, count=before + 1, timeout=self.timeout)  # noqa: B023
                )
            except (TimeoutError, PluginExited) as exc:
                why = (
                    f"{exc}"
                    if isinstance(exc, PluginExited)
                    else f"no registration within {self.timeout:g} s"
                )
                self.results["re_registers_after_restart"] = (
                    "fail",
                    f"{why} after kubelet restart {n} of {count}",
                )
                raise _Stop(f"no registration after kubelet restart {n}") from None
            took.append(reg.at - restarted)
            await self._follow(f"after restart {n}")
        times = ", ".join(f"{t:.2f}" for t in took)
        self.results["re_registers_after_restart"] = (
            "pass",
            f"registered again after each of {count} restarts ({times} s)",
        )

    def _judge(self) -> None:
        attempts = [r for r in self._kubelet.registrations if self._mine(r)]
        self.results["serves_before_registering"] = judge.serves_before_registering(attempts)
        self.results["consistent_options"] = judge.consistent_options(self.connections)
        self.results["initial_list_at_once"] = judge.initial_list_at_once(self.connections, LIST_WAIT)
        self.results["full_lists_only"] = judge.full_lists_only(self.connections)
        self.results["exact_health_strings"] = judge.exact_health_strings(self.connections)
        self.results["unique_socket_per_instance"] = judge.unique_sockets(self.connections)

    async def _sigterm(self) -> None:
        name = "socket_removed_on_sigterm"
        if self.plugin.exited.is_set():
            verdict: CheckStatus = "fail" if self.connections else "skip"
            self.results[name] = (verdict, f"{self.plugin.exit_reason()} before SIGTERM")
            return
        sent = time.monotonic()
        exited = await self.plugin.terminate(SIGTERM_GRACE)
        took = time.monotonic() - sent
        left = sorted(p.name for p in self.dp_dir.iterdir() if p.name != KUBELET_SOCKET and p.is_socket())
        status = self.plugin.status()
        if not exited:
            self.results[name] = ("fail", f"still running {SIGTERM_GRACE:g} s after SIGTERM")
        elif not self.connections:
            self.results[name] = ("skip", f"not registered; on SIGTERM the plugin {status}")
        elif left:
            self.results[name] = ("fail", f"the plugin {status} but left {', '.join(left)} behind")
        else:
            self.results[name] = ("pass", f"the plugin {status} {took:.2f} s after SIGTERM; sockets removed")
