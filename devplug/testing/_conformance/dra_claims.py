"""The claim steps of a DRA conformance run: allocate, prepare (three times), unprepare.

A claim is created and allocated as the scheduler would from the driver's slices, then prepared
as the kubelet does before a pod starts, prepared again (a kubelet restart, a second pod), and
again after its CDI spec was deleted (a reboot empties ``/var/run/cdi``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from devplug._text import counted
from devplug.errors import KubeletError
from devplug.models import ClaimRef
from devplug.testing._conformance import dra_judges as judge
from devplug.testing._conformance.cdi_scan import read_specs, remove_specs
from devplug.testing._kubeapi.scheduler import AllocationError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from devplug.testing._conformance.judges import Outcome
    from devplug.testing._kubeapi.server import FakeKubeAPI
    from devplug.testing._kubelet.kubelet import FakeKubelet
    from devplug.testing._process import PluginProcess

CALL_TIMEOUT = 10.0
"""Seconds any one call may take (the kubelet allows 45; a check must end sooner)."""
NAMESPACE = "conformance"


class Stop(Exception):
    """The run cannot go on; the message says why."""


class ClaimSteps:
    """The claim steps of :class:`~devplug.testing._dra_conformance.DraSession`."""

    driver: str | None
    node: str
    cdi_dir: Path
    plugin: PluginProcess
    results: dict[str, Outcome]
    _api: FakeKubeAPI
    _kubelet: FakeKubelet
    _allocated: list[tuple[str, str]]

    async def _call(self, name: str, call: Any) -> Any:
        """Await ``call()`` within CALL_TIMEOUT; a failure becomes check ``name``'s result (then None)."""
        try:
            return await self.plugin.guard(call, within=CALL_TIMEOUT)
        except KubeletError as exc:
            self.results[name] = ("fail", str(exc))
        except TimeoutError:
            self.results[name] = ("fail", f"no answer within {CALL_TIMEOUT:g} s (the kubelet gives up at 45)")
        return None

    async def _claims(self) -> None:
        driver, kubelet = self.driver, self._kubelet
        assert driver is not None
        ref = await self._allocated_claim()
        if ref is not None:
            await self._prepare(ref)
        unknown = ClaimRef(NAMESPACE, "never-prepared", str(uuid.uuid4()))
        if await self._call("unprepare_unknown_claim", lambda: kubelet.unprepare(driver, [unknown])) is None:
            self.results.setdefault("unprepare_unknown_claim", ("pass", f"claim {unknown.uid} unprepared"))
        await self._entries(ref)

    async def _allocated_claim(self) -> ClaimRef | None:
        api, driver = self._api, self.driver
        assert driver is not None
        api.add_claim(NAMESPACE, "claim-1", requests=[("device", 1)])
        try:
            claim = api.allocate_claim(NAMESPACE, "claim-1", node=self.node, driver=driver, count=1)
        except AllocationError as exc:
            for name in ("prepare_allocated_claim", "idempotent_prepare"):
                self.results[name] = ("skip", f"no claim could be allocated: {exc}")
            return None
        results = claim["status"]["allocation"]["devices"]["results"]
        self._allocated = [(r["pool"], r["device"]) for r in results if r["driver"] == driver]
        return ClaimRef(NAMESPACE, "claim-1", claim["metadata"]["uid"])

    async def _prepare(self, ref: ClaimRef) -> None:
        driver, kubelet, uid = self.driver, self._kubelet, ref.uid
        assert driver is not None
        first = await self._call("prepare_allocated_claim", lambda: kubelet.prepare(driver, [ref]))
        if first is None:
            self.results["idempotent_prepare"] = ("skip", "the first prepare failed")
            return
        problem = judge.prepared_problem(first[uid], self._allocated, read_specs(self.cdi_dir))
        devices = ", ".join(f"{d.pool}/{d.device}" for d in first[uid].devices)
        self.results["prepare_allocated_claim"] = (
            ("fail", problem) if problem else ("pass", f"prepared {devices}")
        )
        again = await self._call("idempotent_prepare", lambda: kubelet.prepare(driver, [ref]))
        if again is None:
            return
        if again[uid] != first[uid]:
            self.results["idempotent_prepare"] = (
                "fail",
                f"the second answer differs: {again[uid]} != {first[uid]}",
            )
            return
        # Only the IDs a spec defined before can be lost (a malformed one fails the check above).
        ids = {i for d in first[uid].devices for i in d.cdi_device_ids}
        ids = {i for i in ids if not judge.cdi_problem(i, read_specs(self.cdi_dir))}
        removed = remove_specs(self.cdi_dir, ids)
        third = await self._call("idempotent_prepare", lambda: kubelet.prepare(driver, [ref]))
        if third is None:
            return
        specs = read_specs(self.cdi_dir)
        lost = sorted(i for i in ids if judge.cdi_problem(i, specs))
        if third[uid] != first[uid]:
            verdict: Outcome = ("fail", f"after the CDI spec was deleted the answer differs: {third[uid]}")
        elif lost:
            verdict = ("fail", f"{lost[0]}: its spec was deleted (as by a reboot) and not written again")
        else:
            verdict = ("pass", f"same answer 3 times; {len(removed)} deleted spec files written again")
        self.results["idempotent_prepare"] = verdict

    async def _shares(self) -> None:
        """Two claims, each given a share of one device the driver publishes as shared, prepared
        together and unprepared: each answer names its share."""
        driver, kubelet, api = self.driver, self._kubelet, self._api
        assert driver is not None
        shared = [
            d["name"]
            for s in api.slices(node=self.node, driver=driver)
            for d in s["spec"].get("devices") or ()
            if d.get("allowMultipleAllocations")
        ]
        if not shared:
            self.results["shared_devices"] = ("skip", "the driver publishes no shared device")
            return
        # One the claim of the earlier checks does not hold, where there is one (it keeps its share).
        held = {device for _, device in self._allocated}
        shared.sort(key=lambda name: name in held)
        refs, results = [], []
        try:
            for number in (1, 2):
                name = f"share-{number}"
                api.add_claim(NAMESPACE, name, requests=[("device", 1)])
                claim = api.allocate_claim(
                    NAMESPACE, name, node=self.node, driver=driver, devices=[shared[0]]
                )
                refs.append(ClaimRef(NAMESPACE, name, claim["metadata"]["uid"]))
                results.append(claim["status"]["allocation"]["devices"]["results"][0])
        except AllocationError as exc:
            self.results["shared_devices"] = (
                "fail",
                f"device {shared[0]} is published as shared, but two claims cannot each have a share: {exc}",
            )
            return
        answers = await self._call("shared_devices", lambda: kubelet.prepare(driver, refs))
        if answers is None:
            return
        problem = _share_problem(refs, results, answers)
        if problem:
            self.results["shared_devices"] = ("fail", problem)
            return
        await self._call("shared_devices", lambda: kubelet.unprepare(driver, refs))  # None either way
        self.results.setdefault(
            "shared_devices", ("pass", f"2 shares of {shared[0]} prepared and unprepared")
        )

    async def _entries(self, ref: ClaimRef | None) -> None:
        driver, kubelet = self.driver, self._kubelet
        assert driver is not None
        ghost = ClaimRef(NAMESPACE, "no-such-claim", str(uuid.uuid4()))
        claims = (
            [ref, ghost]
            if ref is not None
            else [ghost, ClaimRef(NAMESPACE, "no-such-claim-2", str(uuid.uuid4()))]
        )
        wanted = {c.uid for c in claims}
        prepared = await self._call("entry_per_claim", lambda: kubelet.prepare_raw(driver, claims))
        if prepared is None:
            return
        if set(prepared) != wanted:
            self.results["entry_per_claim"] = (
                "fail",
                _entries_problem("NodePrepareResources", wanted, prepared),
            )
            return
        unprepared = await self._call("entry_per_claim", lambda: kubelet.unprepare_raw(driver, claims))
        if unprepared is None:
            return
        errors = {uid: e for uid, e in unprepared.items() if e}
        if set(unprepared) != wanted:
            verdict: Outcome = ("fail", _entries_problem("NodeUnprepareResources", wanted, unprepared))
        elif errors:
            uid, error = next(iter(errors.items()))
            verdict = ("fail", f"NodeUnprepareResources failed for claim {uid}: {error}")
        else:
            note = "" if prepared[ghost[2]].error else "; a claim missing from the API prepared without error"
            entries = f"{counted(len(claims), 'entry', 'entries')} for {counted(len(claims), 'claim')}"
            verdict = ("pass", f"{entries} in both calls{note}")
        self.results["entry_per_claim"] = verdict


def _share_problem(refs: list[ClaimRef], results: list[dict[str, Any]], answers: Mapping[str, Any]) -> str:
    """Why two claims' shares of one device were not prepared as the kubelet needs, or ""."""
    for ref, result in zip(refs, results, strict=True):
        devices = answers[ref.uid].devices
        if len(devices) != 1 or devices[0].device != result["device"]:
            return f"claim {ref.name}: the answer names {[d.device for d in devices]}, not {result['device']}"
        if devices[0].share_id != result.get("shareID"):
            return (
                f"claim {ref.name}: the answer's share_id is {devices[0].share_id!r}, the allocation's "
                f"shareID {result.get('shareID')!r} (v1 answers carry it, or the kubelet loses the share)"
            )
    return ""


def _entries_problem(method: str, wanted: set[str], got: Mapping[str, object]) -> str:
    extra, missing = sorted(set(got) - wanted), sorted(wanted - set(got))
    if extra:
        return f"{method} answered for claim {extra[0]}, which was not asked for (the kubelet fails the pod)"
    skipped = counted(len(missing), "claim")
    return f"{method} left out claim {missing[0]} (the kubelet fails the pod: skipped {skipped})"
