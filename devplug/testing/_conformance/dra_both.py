"""The both-API step of a DRA conformance run: a driver that also serves the device-plugin API on
the node must withhold, on each side, what the other side gave.

Through the device plugin: a pod is given a device by Allocate (recorded in the kubelet's
pod-resources API); within :data:`WITHHELD_WITHIN` a device of the slices must carry a
``NoSchedule`` taint or be left out. Through DRA: the scheduler allocates a claim a device of
the node's pool; within the same time one more device must be Unhealthy on the device-plugin
stream (the kubelet neither counts nor assigns it).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from devplug.errors import KubeletError
from devplug.testing._kubeapi.scheduler import AllocationError

if TYPE_CHECKING:
    from devplug.testing._conformance.judges import Outcome
    from devplug.testing._kubeapi.server import FakeKubeAPI
    from devplug.testing._kubelet.kubelet import FakeKubelet
    from devplug.testing._process import PluginProcess

WITHHELD_WITHIN = 1.0
"""Seconds within which a device given through one API must be withheld from the other."""
NAMESPACE = "conformance"
POD = f"{NAMESPACE}/both-apis"
REGISTERED_WITHIN = 1.0
"""Seconds a driver gets to register a device-plugin resource (by this step its DRA side has
registered and published long ago, and a driver serving both APIs registers both at once)."""


def _withheld(api: FakeKubeAPI, node: str, driver: str) -> set[str]:
    """The published devices that carry a NoSchedule or NoExecute taint."""
    return {
        d["name"]
        for s in api.slices(node=node, driver=driver)
        for d in s["spec"].get("devices") or ()
        if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in d.get("taints") or ())
    }


def _offered(api: FakeKubeAPI, node: str, driver: str) -> set[str]:
    return {d["name"] for s in api.slices(node=node, driver=driver) for d in s["spec"].get("devices") or ()}


class BothSteps:
    """The both-API step of :class:`~devplug.testing._conformance.dra_session.DraSession`."""

    driver: str | None
    node: str
    plugin: PluginProcess
    results: dict[str, Outcome]
    _api: FakeKubeAPI
    _kubelet: FakeKubelet

    async def _both(self) -> None:
        self.results["both_apis"] = await self._both_outcome()

    async def _both_outcome(self) -> Outcome:
        kubelet = self._kubelet
        with contextlib.suppress(TimeoutError):  # registered long ago by now, if ever
            await kubelet.wait_for(
                lambda: next((r for r in kubelet.registrations if r.accepted), None),
                timeout=REGISTERED_WITHIN,
            )
        resources = sorted({r.resource for r in kubelet.registrations if r.accepted})
        if not resources:
            return "skip", "no device-plugin resource registered: the driver serves DRA only"
        for resource in resources:  # the first with 2 healthy devices: one for each side
            try:
                await kubelet.wait_for_devices(resource, timeout=REGISTERED_WITHIN)
            except TimeoutError:
                return "fail", f"{resource} registered but sent no device list"
            healthy = [d.id for d in kubelet.resource(resource).devices if d.health == "Healthy"]
            if len(healthy) >= 2:
                break
        else:
            return "skip", "no device-plugin resource lists 2 healthy devices: nothing to give on both sides"
        to_dra = await self._withheld_from_dra(resource, healthy[0])
        if isinstance(to_dra, tuple):
            return to_dra
        to_plugin = await self._withheld_from_plugin(resource)
        if isinstance(to_plugin, tuple):
            return to_plugin
        return "pass", (
            f"withheld from DRA {to_dra:.2f} s after Allocate, from the device plugin "
            f"{to_plugin:.2f} s after a claim's allocation"
        )

    async def _withheld_from_dra(self, resource: str, device: str) -> Outcome | float:
        """Allocate ``device`` to a pod; seconds until a device of the slices is withheld."""
        kubelet, api, driver, node = self._kubelet, self._api, self.driver, self.node
        assert driver is not None
        withheld, offered = _withheld(api, node, driver), _offered(api, node, driver)
        try:
            await kubelet.allocate(resource, [device], pod=POD)
        except KubeletError as exc:
            return "fail", f"Allocate of {resource} device {device} failed: {exc}"
        given = time.monotonic()

        def changed(_: object) -> bool:
            return bool(offered - _offered(api, node, driver) or _withheld(api, node, driver) - withheld)

        try:
            await api.wait_for_slices(node, driver, predicate=changed, timeout=WITHHELD_WITHIN)
        except TimeoutError:
            return "fail", (
                f"{resource} device {device} given by Allocate, but no device of the slices was "
                f"tainted or left out within {WITHHELD_WITHIN:g} s: a claim could get it too"
            )
        return time.monotonic() - given

    async def _withheld_from_plugin(self, resource: str) -> Outcome | float:
        """Allocate a claim a device; seconds until one more device is Unhealthy on the stream."""
        kubelet, api, driver, node = self._kubelet, self._api, self.driver, self.node
        assert driver is not None
        unhealthy = {d.id for d in kubelet.resource(resource).devices if d.health != "Healthy"}
        # A device no claim holds yet (a shared one may already be held by an earlier step's).
        held = {
            r.get("device")
            for c in api.claims()
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or ()
        }
        free = sorted(_offered(api, node, driver) - _withheld(api, node, driver) - held)
        if not free:
            return "skip", "no free device left to allocate a claim after the Allocate"
        name = free[0]
        api.add_claim(NAMESPACE, "both-apis", requests=[("device", 1)])
        try:
            api.allocate_claim(NAMESPACE, "both-apis", node=node, driver=driver, devices=[name])
        except AllocationError as exc:
            return "skip", f"device {name} could not be allocated to a claim: {exc}"
        allocated = time.monotonic()

        def turned() -> bool | None:
            now = {d.id for d in kubelet.resource(resource).devices if d.health != "Healthy"}
            return True if now - unhealthy else None

        try:
            await kubelet.wait_for(turned, timeout=WITHHELD_WITHIN)
        except TimeoutError:
            return "fail", (
                f"a claim was allocated device {name}, but no {resource} device turned Unhealthy "
                f"within {WITHHELD_WITHIN:g} s: the kubelet could give it to a pod too"
            )
        took = time.monotonic() - allocated
        api.delete_claim(NAMESPACE, "both-apis")
        kubelet.end_pod(POD)
        return took
