"""The feature gates of NVIDIA's DRA driver (``--feature-gates``, ``FEATURE_GATES``).

Parsed as Kubernetes' ``component-base/featuregate`` parses them for ``gpu-kubelet-plugin``
v0.5.0: ``Name=true,Other=false``; values as Go's ``strconv.ParseBool`` reads them; ``AllAlpha``
and ``AllBeta`` set every alpha or beta gate not named explicitly; an unknown name, a missing
value or a bad one is refused with Kubernetes' text; then the combinations NVIDIA refuses
(``ValidateFeatureGates``). The defaults are NVIDIA's: every alpha gate off.

Pure: text in, a frozen mapping out.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "COMPUTE_DOMAIN_CLIQUES",
    "COMPUTE_DOMAIN_GATES",
    "CONSUMABLE_SHARES",
    "CRASH_ON_NVLINK_FABRIC_ERRORS",
    "DEVICE_METADATA",
    "DRA_LIST_TYPE_ATTRIBUTES",
    "DYNAMIC_MIG",
    "FABRIC_MANAGER_PARTITIONING",
    "GATES",
    "HOST_MANAGED_IMEX_DAEMON",
    "IMEX_DAEMONS_WITH_DNS_NAMES",
    "MPS_SUPPORT",
    "NVML_DEVICE_HEALTH_CHECK",
    "PASSTHROUGH_SUPPORT",
    "TIME_SLICING_SETTINGS",
    "FeatureGateError",
    "parse_feature_gates",
]

TIME_SLICING_SETTINGS = "TimeSlicingSettings"
MPS_SUPPORT = "MPSSupport"
PASSTHROUGH_SUPPORT = "PassthroughSupport"
DYNAMIC_MIG = "DynamicMIG"
NVML_DEVICE_HEALTH_CHECK = "NVMLDeviceHealthCheck"
DEVICE_METADATA = "DeviceMetadata"
FABRIC_MANAGER_PARTITIONING = "FabricManagerPartitioning"
DRA_LIST_TYPE_ATTRIBUTES = "DRAListTypeAttributes"
CONSUMABLE_SHARES = "ConsumableShares"
IMEX_DAEMONS_WITH_DNS_NAMES = "IMEXDaemonsWithDNSNames"
COMPUTE_DOMAIN_CLIQUES = "ComputeDomainCliques"
CRASH_ON_NVLINK_FABRIC_ERRORS = "CrashOnNVLinkFabricErrors"
HOST_MANAGED_IMEX_DAEMON = "HostManagedIMEXDaemon"

Stage = Literal["alpha", "beta"]

GATES: Mapping[str, tuple[bool, Stage]] = MappingProxyType(
    {
        TIME_SLICING_SETTINGS: (False, "alpha"),
        MPS_SUPPORT: (False, "alpha"),
        PASSTHROUGH_SUPPORT: (False, "alpha"),
        DYNAMIC_MIG: (False, "alpha"),
        NVML_DEVICE_HEALTH_CHECK: (False, "alpha"),
        DEVICE_METADATA: (False, "alpha"),
        FABRIC_MANAGER_PARTITIONING: (False, "alpha"),
        DRA_LIST_TYPE_ATTRIBUTES: (False, "alpha"),
        CONSUMABLE_SHARES: (False, "alpha"),
        # Read only by NVIDIA's ComputeDomain components (controller, daemon, their kubelet
        # plugin), known to gpu-kubelet-plugin through the shared registry, as Kubernetes'
        # logging gates are; accepted so that a chart's FEATURE_GATES works unchanged, without
        # effect here as there.
        IMEX_DAEMONS_WITH_DNS_NAMES: (True, "beta"),
        COMPUTE_DOMAIN_CLIQUES: (True, "beta"),
        CRASH_ON_NVLINK_FABRIC_ERRORS: (True, "beta"),
        HOST_MANAGED_IMEX_DAEMON: (False, "alpha"),
        "ContextualLogging": (True, "beta"),
        "LoggingAlphaOptions": (False, "alpha"),
        "LoggingBetaOptions": (True, "beta"),
    }
)
"""Every gate name NVIDIA's ``gpu-kubelet-plugin`` v0.5.0 knows: (default, stage)."""
COMPUTE_DOMAIN_GATES = frozenset(
    {
        IMEX_DAEMONS_WITH_DNS_NAMES,
        COMPUTE_DOMAIN_CLIQUES,
        CRASH_ON_NVLINK_FABRIC_ERRORS,
        HOST_MANAGED_IMEX_DAEMON,
    }
)
"""The gates of NVIDIA's ComputeDomain components: no effect on the GPU driver, NVIDIA's or this."""
_ALL = {"AllAlpha": "alpha", "AllBeta": "beta"}
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# NVIDIA's ValidateFeatureGates, in its order.
_EXCLUSIVE = (
    (DYNAMIC_MIG, PASSTHROUGH_SUPPORT),
    (DYNAMIC_MIG, NVML_DEVICE_HEALTH_CHECK),
    (DYNAMIC_MIG, MPS_SUPPORT),
    (PASSTHROUGH_SUPPORT, NVML_DEVICE_HEALTH_CHECK),
)


class FeatureGateError(ValueError):
    """The gates cannot be parsed, or NVIDIA refuses their combination (the message says why)."""


def _parse_bool(name: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise FeatureGateError(
        f'invalid value of {name}={value}, err: strconv.ParseBool: parsing "{value}": invalid syntax'
    )


def parse_feature_gates(text: str) -> Mapping[str, bool]:
    """Every known gate → enabled, for ``text`` (``Name=true,Other=false``; empty: defaults).

    Raises:
        FeatureGateError: an unknown gate (``unrecognized feature gate: X``), a missing or bad
            value, or a combination NVIDIA refuses.
    """
    asked: dict[str, bool] = {}
    for item in text.split(","):
        if not item:
            continue
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise FeatureGateError(f"missing bool value for {name}")
        asked[name] = _parse_bool(name, value.strip())
    for name in asked:
        if name not in GATES and name not in _ALL:
            raise FeatureGateError(f"unrecognized feature gate: {name}")
    enabled = {name: default for name, (default, _) in GATES.items()}
    for special, stage in _ALL.items():
        if special in asked:
            enabled.update({n: asked[special] for n, (_, s) in GATES.items() if s == stage})
    enabled.update({n: v for n, v in asked.items() if n in GATES})
    if enabled[COMPUTE_DOMAIN_CLIQUES] and not enabled[IMEX_DAEMONS_WITH_DNS_NAMES]:
        raise FeatureGateError(
            f"feature gate validation failed: feature gate {COMPUTE_DOMAIN_CLIQUES} requires "
            f"{IMEX_DAEMONS_WITH_DNS_NAMES} to also be enabled"
        )
    for first, second in _EXCLUSIVE:
        if enabled[first] and enabled[second]:
            raise FeatureGateError(
                f"feature gate validation failed: feature gate {first} is currently mutually "
                f"exclusive with {second}"
            )
    if enabled[DEVICE_METADATA] and not enabled[PASSTHROUGH_SUPPORT]:
        raise FeatureGateError(
            f"feature gate validation failed: feature gate {DEVICE_METADATA} requires "
            f"{PASSTHROUGH_SUPPORT} to also be enabled"
        )
    return MappingProxyType(enabled)
