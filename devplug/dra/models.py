"""The data a DRA driver's hooks handle: claims, their allocated devices and opaque configs.

Pure data: pydantic models with no I/O and no protobuf.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from devplug.models import Device

__all__ = ["AllocatedDevice", "Claim", "OpaqueConfig", "PreparedDevice"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Claim(_Frozen):
    """A ResourceClaim the kubelet asks the driver to prepare or unprepare."""

    uid: str
    namespace: str
    name: str
    resource_claim: dict[str, Any] | None = None
    """The ResourceClaim object as read from the API server at prepare (None at unprepare: the
    claim may be gone by then, and unprepare never reads the API)."""


class AllocatedDevice(_Frozen):
    """One device the scheduler allocated to a claim, as this driver serves it."""

    request: str
    """The claim's request it satisfies: ``gpu``, or ``gpu/small`` for a subrequest."""
    name: str
    """The device's name in the ResourceSlice (a DNS label)."""
    pool: str
    """The pool it was published in (the node's name)."""
    device: Device
    """The plugin's device (as last listed by ``watch_devices``)."""
    admin_access: bool = False
    """Allocated for administrative access: the device may be in use by other claims."""
    share_id: str | None = None
    """The share of a device that allows several allocations (``allowMultipleAllocations``)."""

    @property
    def request_name(self) -> str:
        """The request as containers reference it: ``gpu/small`` reduced to ``gpu``."""
        return self.request.partition("/")[0]


class OpaqueConfig(_Frozen):
    """A driver configuration from the device class or the claim, for this driver only.

    Given to :meth:`~devplug.DevicePlugin.prepare_claim` in order of precedence: class configs
    before claim configs, each in its listed order, so that a later entry overrides an earlier
    one.
    """

    source: Literal["FromClass", "FromClaim"]
    requests: tuple[str, ...] = ()
    """The requests it applies to; empty: every request of the claim."""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """The opaque parameters (any JSON object; for example ``apiVersion``, ``kind`` and fields)."""

    def applies_to(self, request: str) -> bool:
        """Whether this config covers ``request`` (``gpu`` covers its subrequests ``gpu/...``)."""
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


class PreparedDevice(_Frozen):
    """What :meth:`~devplug.DevicePlugin.prepare_claim` returns per allocated device."""

    name: str
    """The device's name in the ResourceSlice (:attr:`AllocatedDevice.name`)."""
    requests: tuple[str, ...] = ()
    """The requests it serves (empty: every request of the claim that uses it)."""
    cdi_device_ids: tuple[str, ...] = ()
    """Fully qualified CDI device names (``vendor.com/class=name``) the runtime applies to every
    container that uses the device; their specs must exist before the container starts."""
