"""NUMA topology from sysfs: which host NUMA node a PCI device or a /dev node sits on.

Feed the answer straight into a device: ``Device(id=..., numa_node=pci_numa_node(bus_id))``
(``None`` means no topology, which the kubelet treats like an empty one). The sysfs root is a
parameter everywhere, so tests can run on a fake tree and a containerised plugin can read the
host's sysfs where it is mounted.

Reads are tiny synchronous file reads of sysfs attributes; call them at discovery time, not
per allocation.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

__all__ = [
    "NUMA_NODE_ATTRIBUTE",
    "PCIE_ROOT_ATTRIBUTE",
    "PCI_BUS_ID_ATTRIBUTE",
    "char_device_numa_node",
    "dev_numa_node",
    "normalize_pci_bus_id",
    "pci_numa_node",
    "pcie_root",
]

PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
"""The standard DRA attribute naming a device's PCIe root complex (``pci0000:00``): claims use it
to ask for devices behind one root (``matchAttribute``)."""
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
"""The standard DRA attribute holding a device's PCI bus ID (``0000:3b:00.0``)."""
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
"""The standard DRA attribute holding a device's NUMA node (an int; KEP-6072, GA in Kubernetes
1.37): claims align devices of several drivers on one node with ``matchAttribute``. A device with
no NUMA affinity does not have it (a -1 would match every other such device)."""

DEFAULT_SYSFS = Path("/sys")

# domain:bus:device.function; the domain may be missing (then 0) or longer than 4 digits
# (NVML writes 8, VMD domains use 5); bus and device are 2 hex digits, the function 0-7.
_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})\.(?P<function>[0-7])$"
)


def normalize_pci_bus_id(bus_id: str) -> str:
    """The sysfs spelling of a PCI bus ID: lower case, a domain of at least 4 hex digits.

    ``00000000:3B:00.0`` (NVML) and ``0000:3b:00.0`` (sysfs) both give ``0000:3b:00.0``;
    ``3b:00.0`` means domain 0.

    Raises:
        ValueError: ``bus_id`` is not a PCI bus ID.
    """
    match = _BUS_ID.match(bus_id.strip().lower())
    if match is None:
        raise ValueError(f"not a PCI bus ID (domain:bus:device.function): {bus_id!r}")
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{match['bus']}:{match['device']}.{match['function']}"


def pci_numa_node(bus_id: str, *, sysfs: str | os.PathLike[str] = DEFAULT_SYSFS) -> int | None:
    """The NUMA node of a PCI device, or None when the host reports none.

    Reads ``<sysfs>/bus/pci/devices/<bus id>/numa_node``; a missing device or file, an
    unreadable value, or ``-1`` (no NUMA affinity, single-node hosts) all give None.

    Raises:
        ValueError: ``bus_id`` is not a PCI bus ID.
    """
    device = Path(sysfs) / "bus" / "pci" / "devices" / normalize_pci_bus_id(bus_id)
    return _read_numa_node(device / "numa_node")


def pcie_root(bus_id: str, *, sysfs: str | os.PathLike[str] = DEFAULT_SYSFS) -> str | None:
    """The PCIe root complex of a PCI device (``pci0000:00``), or None when sysfs does not say.

    ``<sysfs>/bus/pci/devices/<bus id>`` links to the device's place in the hierarchy,
    ``.../devices/pci0000:00/0000:00:01.0/0000:3b:00.0``; the root is the ``pci...`` element.
    Give it as ``attributes={PCIE_ROOT_ATTRIBUTE: root}`` to publish it to DRA.

    Raises:
        ValueError: ``bus_id`` is not a PCI bus ID.
    """
    link = Path(sysfs) / "bus" / "pci" / "devices" / normalize_pci_bus_id(bus_id)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    return next(
        (part for part in Path(target).parts if re.fullmatch(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}", part)), None
    )


def char_device_numa_node(
    major: int, minor: int, *, block: bool = False, sysfs: str | os.PathLike[str] = DEFAULT_SYSFS
) -> int | None:
    """The NUMA node behind a device number, through ``/sys/dev/{char,block}/MAJOR:MINOR/device``.

    None when sysfs has no such device, no ``numa_node`` for it (not a PCI-backed device), or
    says ``-1``.
    """
    kind = "block" if block else "char"
    return _read_numa_node(Path(sysfs) / "dev" / kind / f"{major}:{minor}" / "device" / "numa_node")


def dev_numa_node(
    path: str | os.PathLike[str], *, sysfs: str | os.PathLike[str] = DEFAULT_SYSFS
) -> int | None:
    """The NUMA node of the device behind a /dev node (``/dev/dri/renderD128``, ``/dev/ttyUSB0``).

    The node's device number is looked up under ``<sysfs>/dev/char`` (or ``block``). None when
    the node is missing, is not a device node, or has no NUMA affinity.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return None
    return char_device_numa_node(
        os.major(st.st_rdev), os.minor(st.st_rdev), block=stat.S_ISBLK(st.st_mode), sysfs=sysfs
    )


def _read_numa_node(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        node = int(text)
    except ValueError:
        return None
    return node if node >= 0 else None
