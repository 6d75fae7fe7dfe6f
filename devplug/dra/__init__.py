"""devplug.dra: any :class:`~devplug.DevicePlugin` served as a Kubernetes DRA driver.

Dynamic Resource Allocation (``resource.k8s.io/v1``, GA since Kubernetes 1.34) offers devices
through ResourceSlices in the API server; users ask for them with ResourceClaims and CEL
selectors, and the kubelet asks the node's driver to prepare each claim before its pod starts.
The same plugin class serves both APIs: ``watch_devices`` feeds the slices (a device's
``attributes`` and ``capacity`` are what selectors see), and a claim is prepared by calling
``allocate`` once per request and writing the result as a CDI spec for the claim, unless the
class overrides ``prepare_claim`` / ``unprepare_claim``.

Run it with ``devplug run --api dra MODULE:CLASS``, ``devplug.dra.run(plugin)`` or
``devplug.run(plugin)`` with ``api=dra`` in the settings (``--api dra`` / ``DEVPLUG_API=dra``).
The driver needs the node's name (``--node-name`` or ``NODE_NAME``) and the API server
(``--kubeconfig``, else the pod's service account). With ``--api device-plugin,dra`` the same
plugin objects are served through both APIs at once (:class:`DualHost`), a device held through
one withheld from the other until it is free.

The types only a DRA driver uses are here: what a device declares for DRA (``CounterSet``,
``CounterConsumption``, ``DeviceTaint``, ``CapacityRequestPolicy``, beside ``Device`` in
:mod:`devplug`) and what the
claim hooks take and return (``Claim`` and its ``ResourceClaimDict``, ``AllocatedDevice``,
``OpaqueConfig``, ``PreparedDevice``, ``CdiSpecFile``, and a device's ``DeviceStatus`` with its
``DeviceCondition`` and ``NetworkData``), and ``ClaimRef``, a claim as the kubelet
names it (what the fake kubelet's calls take).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devplug._dra.driver import DraDriver
from devplug._main import DualHost
from devplug.models import (
    AllocatedDevice,
    CapacityRequestPolicy,
    CdiSpecFile,
    Claim,
    ClaimRef,
    CounterConsumption,
    CounterSet,
    DeviceCondition,
    DeviceStatus,
    DeviceTaint,
    NetworkData,
    OpaqueConfig,
    PreparedDevice,
    ResourceClaimDict,
)

if TYPE_CHECKING:
    from devplug.plugin import DevicePlugin
    from devplug.settings import Settings

__all__ = [
    "AllocatedDevice",
    "CapacityRequestPolicy",
    "CdiSpecFile",
    "Claim",
    "ClaimRef",
    "CounterConsumption",
    "CounterSet",
    "DeviceCondition",
    "DeviceStatus",
    "DeviceTaint",
    "DraDriver",
    "DualHost",
    "NetworkData",
    "OpaqueConfig",
    "PreparedDevice",
    "ResourceClaimDict",
    "run",
    "serve",
]


async def serve(
    plugins: DevicePlugin | list[DevicePlugin], settings: Settings, *, handle_signals: bool = True
) -> None:
    """:func:`devplug.serve` with ``api`` set to ``dra``: serve ``plugins`` as one DRA driver
    until cancelled (or SIGTERM / SIGINT).

    Raises:
        ConfigError: no node name, no usable kubeconfig, a directory that cannot be created or
            written to, another instance of the driver on the same sockets, a hook that cannot
            work as written.
    """
    from devplug._main import serve as serve_main

    api = settings.api if settings.serves_dra else "dra"  # both APIs stay both
    await serve_main(plugins, settings.model_copy(update={"api": api}), handle_signals=handle_signals)


def run(
    plugins: DevicePlugin | list[DevicePlugin],
    settings: Settings | None = None,
    *,
    driver_name: str | None = None,
    argv: list[str] | None = None,
    prog: str | None = None,
) -> int:
    """:func:`devplug.run` with ``api`` set to ``dra`` (an alias kept for a driver's ``main``):
    serve ``plugins`` as a DRA driver until SIGTERM / SIGINT, return 0.

    Without ``settings`` the standard options are read as :func:`devplug.run` reads them
    (``argv``, ``DEVPLUG_*``, ``--config``), with ``api`` set to ``dra``; ``driver_name``, when
    given, is the default of ``--driver-name``. Bad options print one line and raise
    ``SystemExit(2)``.
    """
    from devplug._main import run as run_main

    return run_main(plugins, settings, argv=argv, prog=prog, api="dra", driver_name=driver_name)
