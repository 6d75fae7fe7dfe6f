"""The class plugin authors subclass.

Who calls what, and when:

* ``watch_devices`` is started once per resource when the resource is served and iterated for
  as long as it runs. Every item it yields is the *complete* device set; devplug versions it and
  streams it to the kubelet (and to any other ListAndWatch client).
* ``allocate`` says what a consumer of some devices gets. Served as a device plugin, it is called
  once per container of each kubelet Allocate call; served as a DRA driver, once per request of
  a claim being prepared (unless ``prepare_claim`` prepares the claim itself). Its docstring
  says exactly when.
* ``preferred_allocation`` is offered to the kubelet only when a subclass overrides it.
* ``pre_start_container`` is called before every container start only when overridden.
* ``cdi_spec``, when overridden, is called with every new device set before the kubelet sees
  it (so before the first registration); devplug writes the spec it returns to the CDI
  directory, where the container runtime resolves the names ``allocate`` returns.

Served as a DRA driver (``--api dra``), the same class needs no change: ``watch_devices`` feeds
the ResourceSlices, and a claim's devices are prepared by calling ``allocate`` once per request
of the claim and writing what it returns as a CDI spec for the claim. ``prepare_claim`` and
``unprepare_claim`` are called, when overridden, for drivers that need more.

Besides these hooks and the attributes of :class:`DevicePlugin`, devplug reads nothing off a
subclass: which hooks it overrides is worked out outside the class (``devplug._hooks``), so any
other attribute or method name (``options``, say) is the author's to use.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar, TypeVar

import structlog

from devplug.settings import Settings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from devplug.cdi import CdiSpec
    from devplug.models import (
        AllocatedDevice,
        Claim,
        ContainerAllocation,
        Device,
        OpaqueConfig,
        PreparedDevice,
    )

__all__ = ["DevicePlugin"]

P = TypeVar("P", bound="DevicePlugin")


class DevicePlugin(abc.ABC):
    """One extended resource (``vendor.com/name``) served to the kubelet.

    Subclasses set :attr:`resource_name` and implement :meth:`watch_devices` and :meth:`allocate`.
    The options sent to the kubelet follow from which optional hooks are overridden. A hook
    written so that devplug cannot call it (a plain ``def allocate``, a ``watch_devices`` that is
    not an async generator) is refused when serving starts, with a ConfigError naming it.
    """

    resource_name: str
    """The extended resource name, e.g. ``example.com/widget``."""
    settings_class: ClassVar[type[Settings]] = Settings
    """What ``devplug run MODULE:CLASS`` parses: a :class:`Settings` subclass adds the plugin's
    own options, and :meth:`from_settings` builds the plugin from them."""
    dra_partition_type_attribute: ClassVar[str | None] = None
    """DRA: the string attribute that names the partition type of this plugin's devices that
    consume shared counters (``profile`` for ``1g.10gb``, ``3g.40gb``: a bare name is in the
    driver's domain), published as the slices' ``partitionTypeAttribute`` (Kubernetes 1.37,
    alpha: a server without the feature drops it and devplug stops sending it). Every such
    device must carry it, or it is not published."""
    dra_standard_attributes: ClassVar[bool] = True
    """DRA: publish devplug's own attributes with every device (``id``: the device ID,
    ``resourceName``, ``numaNode``: the first NUMA node). Off for a driver whose attribute set
    must match another implementation's exactly. Kubernetes' standard
    ``resource.kubernetes.io/numaNode`` goes with every device that has a NUMA node either way."""
    remove_cdi_spec_on_stop: bool = False
    """Remove the file written for :meth:`cdi_spec` when the resource stops. Off by default:
    containers that restart after the plugin has stopped still need their devices' edits."""

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """A structlog logger bound to this resource, for use in hooks."""
        logger: structlog.typing.FilteringBoundLogger = structlog.get_logger("devplug.plugin").bind(
            resource=self.resource_name
        )
        return logger

    @abc.abstractmethod
    def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        """Yield the full device set now, then again whenever it changes.

        Write it as an ``async def`` generator. If it raises, the error is logged, the last
        yielded set stays in force, and the generator is started again after a back-off. If it
        returns, the last set stays in force for good.
        """

    @abc.abstractmethod
    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        """Say what the consumer of ``devices`` gets: device nodes, mounts, environment, CDI names.

        Served as a device plugin: called by the kubelet's Allocate at pod admission, once per
        container that asks for the resource (one Allocate call may hold several containers,
        answered in order), with the devices the kubelet chose for that container, in its order
        (all known to devplug: unknown IDs are refused before the hook runs). The answer is that
        container's ``ContainerAllocateResponse``, which the kubelet checkpoints and replays on
        container restarts without calling again. Raising fails the pod's admission with the
        exception's message; the plugin keeps serving.

        Served as a DRA driver: called while the kubelet prepares a claim (before its first
        pod's sandbox starts), under the driver's lock, only when the class does not override
        :meth:`prepare_claim` or its ``prepare_claim`` returned None for the claim. It is then
        called once per request of the claim (a subrequest ``gpu/small`` counts as its request
        ``gpu``), with this resource's devices allocated for that request, in the allocation's
        order. The answer goes to no container directly: its device nodes, mounts and
        environment become one CDI device ``k8s.<driver>/claim=<claim UID>-<request>`` in the
        claim's spec file (its annotations become that CDI device's annotations, which runtimes
        do not apply), and its ``cdi_devices`` are handed on beside that name; every container
        that uses the request gets them all. A repeated prepare of the claim is answered from
        the driver's checkpoint without calling again. Raising fails the claim's preparation
        with the exception's message, and the kubelet retries.

        Under both APIs the host paths of the answer's device nodes and mounts are checked
        (``host_path_check``), and with ``refuse`` a missing one fails the call.
        """

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str] | None:
        """Choose ``size`` device IDs out of ``available``, including every ``must_include`` one.

        Return ``None`` to use devplug's default choice. Whatever is returned is repaired into a
        valid choice (exact size, must-include kept, only available IDs), and an exception falls
        back to the default choice: the kubelet never sees this hook fail.
        """
        return None

    async def pre_start_container(self, devices: Sequence[Device]) -> None:  # noqa: B027 - optional hook
        """Prepare ``devices`` before a container that holds them starts (30 s kubelet timeout)."""

    def cdi_spec(self, devices: Sequence[Device]) -> CdiSpec | None:
        """The CDI spec for ``devices`` (the complete new set), or None to write none.

        Called only when overridden, with every new device set, before the kubelet sees it.
        devplug writes the spec atomically as ``<cdi_dir>/<vendor>-<class>.json`` (rewritten
        only when its content changes). If this raises, the error is logged, the previous file
        stays, and the devices are still listed.
        """
        return None

    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        """DRA: prepare this driver's ``devices`` of ``claim`` before its first pod's sandbox starts.

        Called (only when overridden) once per claim, under the driver's lock, with the class
        and claim configs meant for this driver (class first, then claim: later entries win).
        Return None for devplug's default preparation (``allocate`` per request, written as a
        CDI spec for the claim), or one :class:`PreparedDevice` per device with the CDI names
        it needs in ``cdi_devices`` (and, in ``cdi_spec_file``, the spec file defining them, for
        devplug to write, keep and remove with the claim). The answer is checkpointed: a
        repeated prepare of the claim returns it again without calling this hook (rewriting a
        handed-over spec file that has gone missing). Raising fails the claim's preparation
        with the message. When the claim fails after this hook returned (the checkpoint cannot
        be written, the answer is refused, a spec conflicts, another resource's hook raises),
        :meth:`unprepare_claim` is called to undo it; a hook that raises cleans up after itself.
        """
        return None

    async def unprepare_claim(self, claim: Claim) -> None:  # noqa: B027 - optional hook
        """DRA: undo :meth:`prepare_claim` for ``claim`` (called only when overridden).

        Called once the claim's last pod is gone, from the driver's checkpoint alone (the claim
        may be deleted already: ``claim.resource_claim`` is None), and to roll back a prepare
        that failed after :meth:`prepare_claim` returned. Raising fails the unprepare, which the
        kubelet retries (in a rollback it is logged, and the prepare's own error stands).
        """

    async def release_device(self, name: str) -> None:  # noqa: B027 - optional hook
        """DRA: the device ``name`` (its ResourceSlice name) is no longer prepared for any claim
        on this node: undo what was set up for the device as a whole (called only when
        overridden).

        Called after :meth:`unprepare_claim` of the claim that held it last: for a shared
        device (:attr:`~devplug.Device.allow_multiple_allocations`) when its last share is
        unprepared, for any other device with its claim; also when a failed prepare is undone
        and no other claim holds the device. What is prepared comes from the driver's
        checkpoint, so this holds across restarts; a crash before the unprepare is recorded
        calls it again, so it must be idempotent. Raising fails the unprepare, which the
        kubelet retries.
        """

    @classmethod
    def from_settings(cls: type[P], settings: Settings) -> P:
        """Build the plugin for ``devplug run`` from its parsed settings (default: no arguments)."""
        return cls()
