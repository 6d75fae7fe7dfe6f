"""devplug.topology on a fake sysfs tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devplug import Device
from devplug.topology import char_device_numa_node, dev_numa_node, normalize_pci_bus_id, pci_numa_node


def fake_pci(sysfs: Path, bus_id: str, numa: str | None) -> None:
    device = sysfs / "bus" / "pci" / "devices" / bus_id
    device.mkdir(parents=True)
    if numa is not None:
        (device / "numa_node").write_text(numa)


@pytest.mark.parametrize(
    ("given_id", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML: 8-digit domain, upper case
        ("0000:3b:00.0", "0000:3b:00.0"),  # sysfs
        ("3b:00.1", "0000:3b:00.1"),  # no domain
        ("00010000:01:00.0", "10000:01:00.0"),  # a VMD domain keeps its fifth digit
        (" 0000:AF:1F.7\n", "0000:af:1f.7"),
    ],
)
def test_bus_id_forms(given_id: str, expected: str) -> None:
    assert normalize_pci_bus_id(given_id) == expected


@pytest.mark.parametrize("bad", ["", "3b:00", "0000:3b:00.8", "0000:3g:00.0", "000000000:3b:00.0", "gpu0"])
def test_bad_bus_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus ID"):
        normalize_pci_bus_id(bad)


@given(st.integers(0, 0xFFFF), st.integers(0, 255), st.integers(0, 31), st.integers(0, 7), st.booleans())
def test_nvml_and_sysfs_forms_agree(domain: int, bus: int, dev: int, fn: int, upper: bool) -> None:
    nvml = f"{domain:08X}:{bus:02X}:{dev:02X}.{fn}"
    sysfs = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
    assert normalize_pci_bus_id(nvml if upper else nvml.lower()) == sysfs == normalize_pci_bus_id(sysfs)


@pytest.mark.parametrize(
    ("content", "expected"),
    [("1\n", 1), ("0", 0), ("-1\n", None), ("garbage", None), (None, None)],
    ids=["node-1", "node-0", "minus-one", "garbage", "no-file"],
)
def test_pci_numa_node(tmp_path: Path, content: str | None, expected: int | None) -> None:
    fake_pci(tmp_path, "0000:3b:00.0", content)
    assert pci_numa_node("00000000:3B:00.0", sysfs=tmp_path) == expected


def test_pci_device_missing(tmp_path: Path) -> None:
    assert pci_numa_node("0000:3b:00.0", sysfs=tmp_path) is None
    assert pci_numa_node("0000:3b:00.0", sysfs=tmp_path / "no-sysfs") is None


def test_dev_node_through_sys_dev_char(tmp_path: Path) -> None:
    st_null = os.stat("/dev/null")
    major, minor = os.major(st_null.st_rdev), os.minor(st_null.st_rdev)
    # /sys/dev/char/M:m/device is a link into the PCI device directory on a real host.
    fake_pci(tmp_path, "0000:af:00.0", "1\n")
    link = tmp_path / "dev" / "char" / f"{major}:{minor}"
    link.mkdir(parents=True)
    (link / "device").symlink_to(tmp_path / "bus" / "pci" / "devices" / "0000:af:00.0")
    assert dev_numa_node("/dev/null", sysfs=tmp_path) == 1
    assert char_device_numa_node(major, minor, sysfs=tmp_path) == 1
    assert char_device_numa_node(major, minor, block=True, sysfs=tmp_path) is None
    assert Device(id="x", numa_node=dev_numa_node("/dev/null", sysfs=tmp_path)).numa_nodes == (1,)


def test_dev_node_without_topology(tmp_path: Path) -> None:
    assert dev_numa_node("/dev/null", sysfs=tmp_path) is None  # nothing under /sys/dev/char
    assert dev_numa_node(tmp_path / "missing", sysfs=tmp_path) is None
    regular = tmp_path / "file"
    regular.write_text("")
    assert dev_numa_node(regular, sysfs=tmp_path) is None  # not a device node
    assert Device(id="x", numa_node=dev_numa_node("/dev/null", sysfs=tmp_path)).numa_nodes == ()


def test_pcie_root_from_the_device_link(tmp_path: Path) -> None:
    from devplug.topology import PCIE_ROOT_ATTRIBUTE, pcie_root

    real = tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    real.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:3b:00.0").symlink_to(Path("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"))
    assert pcie_root("00000000:3B:00.0", sysfs=tmp_path) == "pci0000:3a"
    assert pcie_root("0000:99:00.0", sysfs=tmp_path) is None
    assert PCIE_ROOT_ATTRIBUTE == "resource.kubernetes.io/pcieRoot"
    assert Device(id="g", attributes={PCIE_ROOT_ATTRIBUTE: "pci0000:3a"}).attributes
