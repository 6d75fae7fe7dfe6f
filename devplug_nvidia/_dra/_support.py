"""What NVIDIA's DRA driver v0.5.0 does that devplug-nvidia does not: refused at start, with one
line saying so (exit status 2), rather than accepted and silently not done.

* ``PassthroughSupport`` (and ``DeviceMetadata``, which needs it): NVIDIA's VFIO devices.
* ``FabricManagerPartitioning`` on a node with an NVSwitch fabric: NVIDIA then connects to Fabric
  Manager, publishes ``partition<N>`` and activates a claim's partition at prepare. On a node
  without one NVIDIA publishes only ``gpuModuleID``, and so does devplug-nvidia.
* ``--metrics-path`` other than ``/metrics`` (or empty), and ``--service-account-name``,
  ``--image-pull-secrets``, ``--image-pull-policy`` other than empty: they shape NVIDIA's own
  metrics server and its MPS control-daemon Deployments; devplug serves ``/metrics`` and runs the
  MPS daemons in its own pod.

The ComputeDomain gates (``IMEXDaemonsWithDNSNames``, ``ComputeDomainCliques``,
``CrashOnNVLinkFabricErrors``, ``HostManagedIMEXDaemon``) are accepted without effect, as NVIDIA's
GPU driver accepts them: only its ComputeDomain components read them.
"""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from devplug.errors import ConfigError
from devplug_nvidia._config._feature_gates import FABRIC_MANAGER_PARTITIONING, PASSTHROUGH_SUPPORT

if TYPE_CHECKING:
    from pathlib import Path

    from devplug_nvidia.config import NvidiaSettings

__all__ = ["METRICS_PATH", "check_fabric", "check_supported", "has_fabric_manager_fabric"]

METRICS_PATH = "/metrics"
"""Where devplug serves its metrics (on ``--metrics-address``, alias ``--http-endpoint``)."""
_SWITCH_MANAGED = b"SW_MNG"
_MPS_DEPLOYMENT_FLAGS = (
    ("service_account_name", "--service-account-name", "service account"),
    ("image_pull_secrets", "--image-pull-secrets", "image pull secrets"),
    ("image_pull_policy", "--image-pull-policy", "image pull policy"),
)


def check_supported(settings: NvidiaSettings) -> None:
    """Refuse the gates and flags devplug-nvidia cannot honour (before discovery).

    Raises:
        ConfigError: one line naming the gate or flag and why.
    """
    gates = settings.gates
    if gates[PASSTHROUGH_SUPPORT]:
        raise ConfigError(
            f"feature gate {PASSTHROUGH_SUPPORT} is not supported: devplug-nvidia publishes no VFIO "
            "devices (type vfio, class vfio.gpu.nvidia.com)"
        )
    path = settings.metrics_path
    if path and _cleaned(path) != METRICS_PATH:
        raise ConfigError(
            f"--metrics-path {path} is not supported: devplug-nvidia serves its metrics at "
            f"{METRICS_PATH} (an empty path turns them off)"
        )
    for field, flag, what in _MPS_DEPLOYMENT_FLAGS:
        if str(getattr(settings, field)).strip():
            raise ConfigError(
                f"{flag} is not supported: it sets the {what} of NVIDIA's MPS control-daemon "
                "Deployments, and devplug-nvidia runs the MPS control daemons in its own pod "
                "(leave it empty)"
            )


def check_fabric(settings: NvidiaSettings, *, proc: Path, sysfs: Path) -> None:
    """Refuse ``FabricManagerPartitioning`` on a node whose GPUs need Fabric Manager.

    Raises:
        ConfigError: one line saying what devplug-nvidia does not do there.
    """
    if settings.gates[FABRIC_MANAGER_PARTITIONING] and has_fabric_manager_fabric(proc=proc, sysfs=sysfs):
        raise ConfigError(
            f"feature gate {FABRIC_MANAGER_PARTITIONING} is not supported yet on a node with an "
            "NVSwitch fabric: devplug-nvidia does not talk to Fabric Manager (no partition<N> "
            "attributes, no partition activated at prepare)"
        )


def has_fabric_manager_fabric(*, proc: Path, sysfs: Path) -> bool:
    """Whether the node's NVLink fabric is managed by Fabric Manager, as NVIDIA's driver tells:
    NVSwitch devices in ``/proc/driver/nvidia-nvswitch/devices``, or an NVLink 5 switch-managed
    fabric (``SW_MNG`` in an InfiniBand device's VPD)."""
    switches = proc / "driver" / "nvidia-nvswitch" / "devices"
    try:
        if any(switches.iterdir()):
            return True
    except OSError:
        pass
    for vpd in sorted(sysfs.glob("class/infiniband/*/device/vpd")):
        try:
            if _SWITCH_MANAGED in vpd.read_bytes():
                return True
        except OSError:
            continue
    return False


def _cleaned(path: str) -> str:
    """``path`` as Go's ``path.Join("/", path)`` leaves it."""
    return re.sub("/+", "/", posixpath.normpath("/" + path))
