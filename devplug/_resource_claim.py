"""The ResourceClaim object as a DRA hook reads it (:attr:`devplug.dra.Claim.resource_claim`).

Types for type checkers only: at run time the object is the plain dict the API server sent,
with every field it holds, named here or not. The names are the ``resource.k8s.io/v1`` API's
JSON names (camelCase), each optional (``total=False``): a server leaves out what is unset.
What devplug reads (the UID, the allocation's results and configs) is spelled out, and the
fields a driver commonly reads beside it; larger parts (the claim's requests, the devices'
status) stay JSON objects.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = [
    "AllocationResult",
    "DeviceAllocationConfiguration",
    "DeviceAllocationResult",
    "DeviceRequestAllocationResult",
    "ObjectMeta",
    "OpaqueDeviceConfiguration",
    "ResourceClaimConsumerReference",
    "ResourceClaimDict",
    "ResourceClaimSpec",
    "ResourceClaimStatus",
]


class ObjectMeta(TypedDict, total=False):
    """The claim's ``metadata``."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[dict[str, Any]]
    finalizers: list[str]


class ResourceClaimSpec(TypedDict, total=False):
    """The claim's ``spec``: what it asks for (``devices``: requests, constraints, config)."""

    devices: dict[str, Any]


class OpaqueDeviceConfiguration(TypedDict, total=False):
    """A config entry's ``opaque`` part: the driver it is for and its parameters."""

    driver: str
    parameters: dict[str, Any]


class DeviceAllocationConfiguration(TypedDict, total=False):
    """One entry of ``status.allocation.devices.config`` (devplug's :class:`OpaqueConfig`)."""

    source: str
    """``FromClass`` or ``FromClaim``."""
    requests: list[str]
    opaque: OpaqueDeviceConfiguration


class DeviceRequestAllocationResult(TypedDict, total=False):
    """One entry of ``status.allocation.devices.results``: a device given to a request."""

    request: str
    driver: str
    pool: str
    device: str
    adminAccess: bool
    shareID: str
    tolerations: list[dict[str, Any]]
    bindingConditions: list[str]
    bindingFailureConditions: list[str]
    consumedCapacity: dict[str, str]


class DeviceAllocationResult(TypedDict, total=False):
    """``status.allocation.devices``."""

    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    """``status.allocation``: what the scheduler allocated, and where."""

    devices: DeviceAllocationResult
    nodeSelector: dict[str, Any]
    allocationTimestamp: str


class ResourceClaimConsumerReference(TypedDict, total=False):
    """One entry of ``status.reservedFor``: a pod (or other consumer) the claim is reserved for."""

    apiGroup: str
    resource: str
    name: str
    uid: str


class ResourceClaimStatus(TypedDict, total=False):
    """The claim's ``status``."""

    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumerReference]
    devices: list[dict[str, Any]]


class ResourceClaimDict(TypedDict, total=False):
    """A ``resource.k8s.io/v1`` ResourceClaim as JSON: ``claim["status"]["allocation"]`` and so on."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: ResourceClaimSpec
    status: ResourceClaimStatus
