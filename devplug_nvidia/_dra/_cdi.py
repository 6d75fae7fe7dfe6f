"""The transient CDI spec NVIDIA's DRA driver writes per prepared claim, built with :mod:`devplug.cdi`.

Kind ``k8s.<driver>/claim`` (``k8s.gpu.nvidia.com/claim``), file
``k8s.<driver>-claim_<claim UID>.yaml`` in YAML as NVIDIA writes it, one device per prepared
device named ``<claim UID>-<device name>``:

* a GPU: its ``/dev/nvidia<minor>``;
* a MIG device: its parent's node plus the GPU- and compute-instance capability nodes
  ``/dev/nvidia-caps/nvidia-cap<N>``, created in the container as character devices (type
  ``c``, the ``nvidia-caps`` major from ``/proc/devices``, ``DeviceFileMinor`` and
  ``DeviceFileMode`` from ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access``).

Spec-wide, the edits of the device plugin's spec (:func:`devplug_nvidia._container._cdi.common_edits`):
``NVIDIA_VISIBLE_DEVICES=void``, the control nodes that exist, the driver's files and hooks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devplug.cdi import CdiDevice, CdiSpec, ContainerEdits, DeviceNode
from devplug_nvidia._container._cdi import common_edits, device_node

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from devplug_nvidia._container._cdi_driver import DriverFiles
    from devplug_nvidia._gpu._model import GpuRecord
    from devplug_nvidia.config import NvidiaSettings

__all__ = [
    "CDI_CLASS",
    "CapabilityError",
    "build_claim_spec",
    "claim_device_id",
    "claim_spec_file",
    "mig_capability_nodes",
    "spec_yaml",
]

CDI_CLASS = "claim"
CAPABILITIES = "driver/nvidia/capabilities"
"""Where the MIG capability files are, under ``/proc``."""
_CAPS_DEVICE = "nvidia-caps"
# CDI's Go structs, whose field order NVIDIA's YAML follows.
_ORDER = {
    "spec": ("cdiVersion", "kind", "annotations", "devices", "containerEdits"),
    "device": ("name", "annotations", "containerEdits"),
    "edits": ("env", "deviceNodes", "netDevices", "hooks", "mounts", "intelRdt", "additionalGids"),
    "node": ("path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"),
    "hook": ("hookName", "path", "args", "env", "timeout"),
    "mount": ("hostPath", "containerPath", "options", "type"),
}


class CapabilityError(OSError):
    """A MIG capability file (or ``/proc/devices``) cannot be read."""


def cdi_kind(driver: str) -> str:
    """``k8s.<driver>/claim``."""
    return f"k8s.{driver}/{CDI_CLASS}"


def claim_spec_file(driver: str, claim_uid: str) -> str:
    """``k8s.<driver>-claim_<uid>.yaml``: the claim's transient spec (CDI's transient name)."""
    return f"k8s.{driver}-{CDI_CLASS}_{claim_uid}.yaml"


def claim_device_name(claim_uid: str, device: str) -> str:
    """``<claim UID>-<device name>``."""
    return f"{claim_uid}-{device}"


def claim_device_id(driver: str, claim_uid: str, device: str) -> str:
    """``k8s.<driver>/claim=<claim UID>-<device name>``: what the kubelet passes to the runtime."""
    return f"{cdi_kind(driver)}={claim_device_name(claim_uid, device)}"


def _caps_major(proc: Path) -> int:
    path = proc / "devices"
    try:
        text = path.read_text()
    except OSError as exc:
        raise CapabilityError(f"error reading '{path}': {exc.strerror}") from None
    characters = text.partition("Character devices:")[2].partition("Block devices:")[0]
    match = re.search(rf"^\s*([0-9]+) {re.escape(_CAPS_DEVICE)}$", characters, re.MULTILINE)
    if match is None:
        raise CapabilityError(f"no {_CAPS_DEVICE} character device in {path}")
    return int(match[1])


def _capability_node(path: Path, major: int) -> DeviceNode:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CapabilityError(f"failed to parse capabilities file {path}: {exc.strerror}") from None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            values[key.strip()] = int(value.strip())
    if "DeviceFileMinor" not in values:
        raise CapabilityError(f"failed to parse capabilities file {path}: no DeviceFileMinor")
    minor = values["DeviceFileMinor"]
    return DeviceNode(
        path=f"/dev/nvidia-caps/nvidia-cap{minor}",
        type="c",
        major=major,
        minor=minor,
        file_mode=values.get("DeviceFileMode"),
    )


def mig_capability_nodes(
    proc: Path, parent_minor: int, gpu_instance: int, compute_instance: int
) -> tuple[DeviceNode, ...]:
    """The GI and CI capability nodes of a MIG device, from the files under ``proc``.

    Raises:
        CapabilityError: a file is missing or unreadable (the MIG device is gone, or ``proc``
            is not the host's).
    """
    major = _caps_major(proc)
    folder = proc / CAPABILITIES / f"gpu{parent_minor}" / "mig" / f"gi{gpu_instance}"
    return (
        _capability_node(folder / "access", major),
        _capability_node(folder / f"ci{compute_instance}" / "access", major),
    )


def device_edits(record: GpuRecord, config: NvidiaSettings, proc: Path) -> ContainerEdits:
    """The edits of one prepared device: its GPU's node, and a MIG device's capability nodes."""
    nodes = [device_node(f"/dev/nvidia{record.minor}", config)]
    if record.mig is not None:
        mig = record.mig
        nodes += mig_capability_nodes(proc, mig.parent_minor, mig.gpu_instance_id, mig.compute_instance_id)
    return ContainerEdits(device_nodes=tuple(nodes))


def build_claim_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[tuple[str, GpuRecord]],
    config: NvidiaSettings,
    *,
    present: Collection[str],
    driver_files: DriverFiles | None,
    proc: Path = Path("/proc"),
) -> CdiSpec:
    """The claim's spec: one device per ``(device name, record)`` (each name once), with the
    common edits spec-wide.

    Raises:
        CapabilityError: a MIG device's capability files cannot be read.
        ValueError: no devices.
    """
    unique = dict(devices)
    return CdiSpec(
        kind=cdi_kind(driver),
        devices=tuple(
            CdiDevice(
                name=claim_device_name(claim_uid, name), container_edits=device_edits(record, config, proc)
            )
            for name, record in unique.items()
        ),
        container_edits=common_edits(config, present=present, driver=driver_files),
    )


# Which _ORDER a key's value (or each item of its list) follows.
_NESTED = {
    "devices": "device",
    "containerEdits": "edits",
    "deviceNodes": "node",
    "hooks": "hook",
    "mounts": "mount",
}


def _ordered(value: dict[str, Any], kind: str) -> dict[str, Any]:
    order = _ORDER[kind]
    out: dict[str, Any] = {}
    for key in sorted(value, key=lambda k: order.index(k) if k in order else len(order)):
        item, nested = value[key], _NESTED.get(key)
        if nested is None:
            out[key] = item
        elif isinstance(item, list):
            out[key] = [_ordered(i, nested) for i in item]
        else:
            out[key] = _ordered(item, nested)
    return out


def spec_yaml(spec: CdiSpec) -> str:
    """The spec file's text as NVIDIA writes it: a YAML document, keys in CDI's field order."""
    # libyaml's emitter where PyYAML has it (the same text, some five times faster).
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    body = yaml.dump(
        _ordered(spec.to_dict(), "spec"), Dumper=dumper, sort_keys=False, default_flow_style=False
    )
    return "---\n" + body
