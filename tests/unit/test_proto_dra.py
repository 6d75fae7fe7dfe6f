"""Wire contract of the DRA kubelet-plugin protos (dra v1/v1beta1, dra-health v1alpha1/v1).

The kubelet calls fixed method paths and reads fixed field numbers; these tests pin both, and
check that all generated modules coexist in one descriptor pool.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

ROOT = Path(__file__).resolve().parents[2]

# Every generated package: (module path under devplug._proto, proto package).
PACKAGES = {
    "deviceplugin.v1beta1": "v1beta1",
    "pluginregistration.v1": "pluginregistration",
    "dra.v1": "k8s.io.kubelet.pkg.apis.dra.v1",
    "dra.v1beta1": "k8s.io.kubelet.pkg.apis.dra.v1beta1",
    "drahealth.v1alpha1": "v1alpha1",
    "drahealth.v1": "v1",
}


def _pb2(package: str) -> ModuleType:
    return importlib.import_module(f"devplug._proto.{package}.api_pb2")


def _grpc(package: str) -> ModuleType:
    return importlib.import_module(f"devplug._proto.{package}.api_pb2_grpc")


def _fields(message: Any) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


class _RecordingChannel:
    """Stands in for grpc.Channel: records the method path of every stub method it is asked for."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def _record(self, kind: str) -> Callable[..., object]:
        def make(path: str, *_args: object, **_kwargs: object) -> object:
            self.paths[path] = kind
            return object()

        return make

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind in {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}:
            return self._record(kind)
        raise AttributeError(kind)


def _stub_paths(package: str, service: str) -> dict[str, str]:
    channel = _RecordingChannel()
    getattr(_grpc(package), f"{service}Stub")(channel)
    return channel.paths


# --- one descriptor pool -------------------------------------------------------------------


def test_all_generated_modules_import_together_in_a_fresh_process() -> None:
    """A duplicate symbol in the default pool fails at import; a fresh interpreter sees every module."""
    modules = [f"devplug._proto.{p}.{m}" for p in PACKAGES for m in ("api_pb2", "api_pb2_grpc")]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    result = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _symbols(file: FileDescriptor) -> list[str]:
    names: list[str] = []

    def walk(message: Descriptor) -> None:
        names.append(message.full_name)
        names.extend(e.full_name for e in message.enum_types)
        for nested in message.nested_types:
            walk(nested)

    for message in file.message_types_by_name.values():
        walk(message)
    for enum in file.enum_types_by_name.values():
        names.append(enum.full_name)
        # proto3 enum values live in the enclosing package's scope.
        names.extend(f"{file.package}.{v.name}" if file.package else v.name for v in enum.values)
    names.extend(s.full_name for s in file.services_by_name.values())
    return names


def test_no_two_protos_register_the_same_name() -> None:
    files = [_pb2(p).DESCRIPTOR for p in PACKAGES]
    assert len({f.package for f in files}) == len(files)
    assert len({f.name for f in files}) == len(files)
    symbols = [name for f in files for name in _symbols(f)]
    duplicates = sorted({n for n in symbols if symbols.count(n) > 1})
    assert not duplicates


@pytest.mark.parametrize(("package", "proto_package"), PACKAGES.items())
def test_proto_packages(package: str, proto_package: str) -> None:
    assert _pb2(package).DESCRIPTOR.package == proto_package


# --- method paths the kubelet calls ---------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_plugin_method_paths(version: str) -> None:
    prefix = f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert _stub_paths(f"dra.{version}", "DRAPlugin") == {
        f"{prefix}/NodePrepareResources": "unary_unary",
        f"{prefix}/NodeUnprepareResources": "unary_unary",
    }
    service = _pb2(f"dra.{version}").DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]


@pytest.mark.parametrize(
    ("package", "service", "path"),
    [
        ("dra.v1", "DRAPlugin", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"),
        ("dra.v1", "DRAPlugin", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"),
        ("dra.v1beta1", "DRAPlugin", "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"),
        ("dra.v1beta1", "DRAPlugin", "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"),
        ("drahealth.v1alpha1", "DRAResourceHealth", "/v1alpha1.DRAResourceHealth/NodeWatchResources"),
        ("drahealth.v1", "DRAResourceHealth", "/v1.DRAResourceHealth/NodeWatchResources"),
    ],
)
def test_kubelet_method_paths_literal(package: str, service: str, path: str) -> None:
    assert path in _stub_paths(package, service)


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
def test_health_method_paths(version: str) -> None:
    # The proto package is the bare version, so the service is e.g. "v1alpha1.DRAResourceHealth".
    assert _stub_paths(f"drahealth.{version}", "DRAResourceHealth") == {
        f"/{version}.DRAResourceHealth/NodeWatchResources": "unary_stream",
    }
    service = _pb2(f"drahealth.{version}").DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == f"{version}.DRAResourceHealth"
    (method,) = service.methods
    assert method.name == "NodeWatchResources"
    assert method.server_streaming and not method.client_streaming


def test_service_names_as_advertised_in_supported_versions() -> None:
    """GetInfo's supported_versions names services as "<last package part>.<service>"."""
    advertised = set()
    for package, service in [
        ("dra.v1", "DRAPlugin"),
        ("dra.v1beta1", "DRAPlugin"),
        ("drahealth.v1alpha1", "DRAResourceHealth"),
        ("drahealth.v1", "DRAResourceHealth"),
    ]:
        descriptor = _pb2(package).DESCRIPTOR
        advertised.add(f"{descriptor.package.rsplit('.', 1)[-1]}.{descriptor.services_by_name[service].name}")
    assert advertised == {
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
        "v1.DRAResourceHealth",
    }


# --- field numbers --------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_field_numbers(version: str) -> None:
    pb = _pb2(f"dra.{version}")
    assert _fields(pb.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert _fields(pb.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert _fields(pb.NodeUnprepareResourceResponse) == {"error": 1}
    assert _fields(pb.NodePrepareResourcesRequest) == {"claims": 1}
    assert _fields(pb.NodeUnprepareResourcesRequest) == {"claims": 1}
    device = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    if version == "v1":
        device["share_id"] = 5
    assert _fields(pb.Device) == device
    repeated = {f.name for f in pb.Device.DESCRIPTOR.fields if f.is_repeated}
    assert repeated == {"request_names", "cdi_device_ids"}


def test_share_id_is_optional_with_presence() -> None:
    pb = _pb2("dra.v1")
    field = pb.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert field.type == FieldDescriptor.TYPE_STRING
    assert field.has_presence
    device = pb.Device(pool_name="p", device_name="d")
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
@pytest.mark.parametrize(
    ("response", "value"),
    [
        ("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
        ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"),
    ],
)
def test_response_claims_are_maps_keyed_by_uid(version: str, response: str, value: str) -> None:
    pb = _pb2(f"dra.{version}")
    field = getattr(pb, response).DESCRIPTOR.fields_by_name["claims"]
    assert field.number == 1
    entry = field.message_type
    assert entry.GetOptions().map_entry
    key, val = entry.fields_by_name["key"], entry.fields_by_name["value"]
    assert (key.number, key.type) == (1, FieldDescriptor.TYPE_STRING)
    assert (val.number, val.message_type.full_name) == (2, f"k8s.io.kubelet.pkg.apis.dra.{version}.{value}")


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
def test_health_field_numbers(version: str) -> None:
    pb = _pb2(f"drahealth.{version}")
    assert _fields(pb.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    types = {f.name: f.type for f in pb.DeviceHealth.DESCRIPTOR.fields}
    assert types["last_updated_time"] == types["health_check_timeout_seconds"] == FieldDescriptor.TYPE_INT64
    assert types["health"] == FieldDescriptor.TYPE_ENUM
    assert _fields(pb.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
    assert _fields(pb.NodeWatchResourcesResponse) == {"devices": 1}
    assert _fields(pb.NodeWatchResourcesRequest) == {}
    assert dict(pb.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


# --- the versions are wire-compatible --------------------------------------------------------


def test_dra_v1_and_v1beta1_share_the_wire_format() -> None:
    v1, v1beta1 = _pb2("dra.v1"), _pb2("dra.v1beta1")
    device = {"request_names": ["r"], "pool_name": "p", "device_name": "d", "cdi_device_ids": ["v.com/c=x"]}
    new = v1.NodePrepareResourcesResponse()
    new.claims["uid-1"].devices.add(**device)
    new.claims["uid-2"].error = "boom"
    old = v1beta1.NodePrepareResourcesResponse()
    old.claims["uid-1"].devices.add(**device)
    old.claims["uid-2"].error = "boom"
    assert v1beta1.NodePrepareResourcesResponse.FromString(new.SerializeToString()) == old
    assert v1.NodePrepareResourcesResponse.FromString(old.SerializeToString()) == new
    request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", uid="u", name="n")])
    again = v1beta1.NodePrepareResourcesRequest.FromString(request.SerializeToString())
    assert (again.claims[0].namespace, again.claims[0].uid, again.claims[0].name) == ("ns", "u", "n")


def test_health_v1alpha1_and_v1_share_the_wire_format() -> None:
    alpha, v1 = _pb2("drahealth.v1alpha1"), _pb2("drahealth.v1")
    fields = {
        "health": 2,
        "last_updated_time": 1_700_000_000,
        "health_check_timeout_seconds": 60,
        "message": "xid 79",
    }
    a = alpha.NodeWatchResourcesResponse(
        devices=[alpha.DeviceHealth(device=alpha.DeviceIdentifier(pool_name="p", device_name="d"), **fields)]
    )
    b = v1.NodeWatchResourcesResponse(
        devices=[v1.DeviceHealth(device=v1.DeviceIdentifier(pool_name="p", device_name="d"), **fields)]
    )
    assert a.SerializeToString() == b.SerializeToString()
    assert v1.NodeWatchResourcesResponse.FromString(a.SerializeToString()) == b
    assert b.devices[0].health == v1.UNHEALTHY
