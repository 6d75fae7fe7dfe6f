"""The kubelet's pod-resources API, read: which devices the running pods hold.

The kubelet serves ``v1.PodResourcesLister`` on ``<kubelet-root>/pod-resources/kubelet.sock``.
Its List names, for every pod it runs, each container's devices: those a device plugin's
Allocate gave (by resource name and device ID) and those of the DRA claims it uses (by driver,
pool, device and share). :func:`read_holders` turns that into who holds which device, the
question a process serving both APIs (or a DRA driver taking a node over from a device plugin)
asks before it gives a device away. Generated protobuf modules and grpc.aio, no state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import grpc

from devplug._grpc_calls import await_call

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from devplug._runtime.ledger import Ledger

__all__ = ["SOCKET", "Holder", "Holders", "PodResourcesError", "follow_pods", "read_holders"]

SOCKET = "pod-resources/kubelet.sock"
"""The API's socket, relative to the kubelet's root directory."""
CALL_TIMEOUT = 5.0
"""Seconds a List may take (the kubelet answers from memory, in milliseconds)."""


class PodResourcesError(Exception):
    """The pod-resources API could not be read (the kubelet is restarting, or absent)."""


@dataclass(frozen=True, order=True)
class Holder:
    """A container that holds a device."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod} (container {self.container})"


@dataclass
class Holders:
    """Who holds which device, by API."""

    plugin: dict[tuple[str, str], list[Holder]] = field(default_factory=dict)
    """(resource name, device ID) → the containers a device plugin's Allocate gave it to."""
    dra: dict[tuple[str, str, str], list[Holder]] = field(default_factory=dict)
    """(driver, pool, device) → the containers using a claim that has it (a shared device's
    shares together)."""

    def of_resource(self, resource: str) -> dict[str, list[Holder]]:
        """The device-plugin holders of ``resource``'s devices, by device ID."""
        return {device: holders for (name, device), holders in self.plugin.items() if name == resource}

    def of_driver(self, driver: str, pool: str) -> dict[str, list[Holder]]:
        """The DRA holders of ``driver``'s devices in ``pool``, by device name."""
        return {
            device: holders
            for (name, at, device), holders in self.dra.items()
            if (name, at) == (driver, pool)
        }


async def read_holders(socket: Path, *, call_timeout: float = CALL_TIMEOUT) -> Holders:
    """List the kubelet's pods on ``socket`` and return who holds which device.

    Raises:
        PodResourcesError: no answer within ``call_timeout``, or an error answer (the message says
            which and names the socket).
    """
    from devplug._proto.podresources.v1 import api_pb2 as pb
    from devplug._proto.podresources.v1 import api_pb2_grpc as pb_grpc

    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pb_grpc.PodResourcesListerStub(channel)
            answer = await await_call(stub.List(pb.ListPodResourcesRequest(), timeout=call_timeout))
    except grpc.aio.AioRpcError as exc:
        code = exc.code().name if exc.code() is not None else "UNKNOWN"
        why = f"{code} {exc.details() or ''}".strip()
        raise PodResourcesError(
            f"the kubelet's pod-resources API on {socket} did not answer List: {why}"
        ) from None
    holders = Holders()
    for pod in answer.pod_resources:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                for device_id in devices.device_ids:
                    holders.plugin.setdefault((devices.resource_name, device_id), []).append(holder)
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    key = (resource.driver_name, resource.pool_name, resource.device_name)
                    holders.dra.setdefault(key, []).append(holder)
    return holders


READ_DELAY = 0.5
"""Seconds between an Allocate and the read it asks for: the kubelet records the devices it
assigned once the answer is back."""


async def follow_pods(
    socket: Path,
    ledger: Ledger,
    *,
    interval: float,
    log: Any,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Read ``socket`` every ``interval`` seconds (and soon after every Allocate) into
    ``ledger``: the devices running pods hold through device plugins (the ledger matches them
    to the devices it knows, whatever resource name gave them). Runs until cancelled.

    A read that fails changes nothing in the ledger (nothing is released on a guess): it is
    logged once per outage and retried, more often while it fails.
    """
    failing: str | None = None
    wanted = ledger.reads_wanted.version
    while True:
        started = clock()
        try:
            holders = await read_holders(socket)
        except PodResourcesError as exc:
            if failing is None:
                log.warning("pod_resources_unavailable", error=str(exc), keeping="the holders known")
            failing = str(exc)
        else:
            if failing is not None:
                log.info("pod_resources_available", socket=str(socket))
            failing = None
            ledger.pods(holders.plugin, read_at=started)
        with anyio.move_on_after(min(interval, 1.0) if failing else interval):
            await ledger.reads_wanted.newer_than(wanted)
            await anyio.sleep(READ_DELAY)
        wanted = ledger.reads_wanted.version
