"""The committed generated modules must be exactly what scripts/gen_proto.py makes from proto/."""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def _tree(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) regenerates the modules")
    gen = _generator()
    gen.generate(tmp_path)  # type: ignore[attr-defined]
    fresh, committed = _tree(tmp_path), _tree(ROOT / "devplug" / "_proto")
    assert sorted(fresh) == sorted(committed), "run: python scripts/gen_proto.py"
    stale = [name for name, path in fresh.items() if not filecmp.cmp(path, committed[name], shallow=False)]
    assert not stale, f"generated modules out of date ({stale}); run: python scripts/gen_proto.py"


def test_wire_names() -> None:
    """The method paths the kubelet calls: the proto package is part of them."""
    from devplug._proto.deviceplugin.v1beta1 import api_pb2
    from devplug._proto.pluginregistration.v1 import api_pb2 as reg

    dp = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert dp.full_name == "v1beta1.DevicePlugin"
    assert [m.name for m in dp.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert api_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == "pluginregistration.Registration"
    fields = {f.name: f.number for f in api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    req = {f.name: f.number for f in api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR.fields}
    assert req == {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}


def test_every_proto_source_is_generated() -> None:
    """A .proto added under proto/ but left out of SOURCES would silently never be generated."""
    gen = _generator()
    on_disk = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    assert sorted(gen.SOURCES) == on_disk  # type: ignore[attr-defined]
    generated = sorted(
        str(p.parent.relative_to(ROOT / "devplug" / "_proto"))
        for p in (ROOT / "devplug" / "_proto").rglob("api_pb2.py")
    )
    assert generated == sorted(s.rsplit("/", 1)[0] for s in gen.SOURCES)  # type: ignore[attr-defined]
