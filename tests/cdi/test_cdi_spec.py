"""devplug.cdi models: names, versions, the JSON written (against a schema and by hand)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from devplug.cdi import (
    CdiDevice,
    CdiMount,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    Hook,
    IntelRdt,
    NetDevice,
    parse_qualified_name,
    qualified_name,
    validate_device_name,
    validate_kind,
)

SCHEMA = json.loads((Path(__file__).parent / "cdi-schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def one(name: str = "gpu0", **edits: Any) -> tuple[CdiDevice, ...]:
    return (CdiDevice(name=name, container_edits=ContainerEdits(**edits)),)


@pytest.mark.parametrize(
    "kind", ["vendor.com/foo", "nvidia.com/gpu", "a/b", "vendor.com/foo.bar", "x-y_z.io/c-1", "v/" + "c" * 63]
)
def test_valid_kinds(kind: str) -> None:
    vendor, klass = validate_kind(kind)
    assert f"{vendor}/{klass}" == kind


BAD_KINDS = "foo vendor.com/foo/bar /foo vendor.com/ 1vendor/foo vendor-/foo vendor.com/foo- vendor.com/-foo"


@pytest.mark.parametrize("kind", [*BAD_KINDS.split(), "vendor.com/f oo", "v/" + "c" * 64])
def test_invalid_kinds(kind: str) -> None:
    with pytest.raises(ValueError, match="invalid CDI kind"):
        validate_kind(kind)


@pytest.mark.parametrize("name", ["0", "gpu0", "a:b", "mig-1g.5gb", "GPU-8f6e_1", "0000:3b:00.0"])
def test_valid_device_names(name: str) -> None:
    assert validate_device_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", "a b", "a/b", "a=b", "a.", "é"])
def test_invalid_device_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid CDI device name"):
        validate_device_name(name)


def test_qualified_names() -> None:
    assert qualified_name("vendor.com/gpu", "0") == "vendor.com/gpu=0"
    assert parse_qualified_name("vendor.com/gpu=mig-1g.5gb") == ("vendor.com", "gpu", "mig-1g.5gb")
    for bad in ("vendor.com/gpu", "gpu=0", "vendor.com/gpu=-0"):
        with pytest.raises(ValueError, match=r"not fully qualified|invalid CDI"):
            parse_qualified_name(bad)
    spec = CdiSpec(kind="vendor.com/gpu", devices=one("gpu0"))
    assert spec.qualified_name("gpu0") == "vendor.com/gpu=gpu0"
    assert spec.file_name == "vendor.com-gpu.json"


def plain(**edits: Any) -> CdiSpec:
    return CdiSpec(kind="v.com/c", devices=one(**edits))


VERSION_CASES = {
    "plain": (plain(env=("A=1",)), "0.3.0"),
    "mount-type": (plain(mounts=(CdiMount(host_path="/a", container_path="/b", type="bind"),)), "0.4.0"),
    "host-path": (plain(device_nodes=(DeviceNode(path="/dev/a", host_path="/dev/b"),)), "0.5.0"),
    "leading-digit": (CdiSpec(kind="v.com/c", devices=one("0")), "0.5.0"),
    "spec-annotations": (CdiSpec(kind="v.com/c", devices=one(), annotations={"a": "b"}), "0.6.0"),
    "device-annotations": (
        CdiSpec(kind="v.com/c", devices=(CdiDevice(name="d", annotations={"a": "b"}),)),
        "0.6.0",
    ),
    "dotted-class": (CdiSpec(kind="v.com/c.d", devices=one()), "0.6.0"),
    "spec-gids": (
        CdiSpec(kind="v.com/c", devices=one(), container_edits=ContainerEdits(additional_gids=(44,))),
        "0.7.0",
    ),
    "intel-rdt": (plain(intel_rdt=IntelRdt(clos_id="x")), "0.7.0"),
    "rdt-schemata": (plain(intel_rdt=IntelRdt(schemata=("L3:0=f",))), "1.1.0"),
    "rdt-monitoring": (plain(intel_rdt=IntelRdt(enable_monitoring=True)), "1.1.0"),
    "net-devices": (plain(net_devices=(NetDevice(host_interface_name="eth1", name="net0"),)), "1.1.0"),
}


@pytest.mark.parametrize(("spec", "version"), VERSION_CASES.values(), ids=VERSION_CASES.keys())
def test_lowest_version_for_the_features_used(spec: CdiSpec, version: str) -> None:
    assert spec.required_version() == version
    assert spec.to_dict()["cdiVersion"] == version
    VALIDATOR.validate(spec.to_dict())


def test_explicit_versions() -> None:
    assert CdiSpec(cdi_version="1.0.0", kind="v.com/c", devices=one()).to_dict()["cdiVersion"] == "1.0.0"
    with pytest.raises(
        ValidationError, match=r"cdiVersion 0\.4\.0 is too low for this spec: it needs 0\.5\.0"
    ):
        CdiSpec(cdi_version="0.4.0", kind="v.com/c", devices=one("0"))
    with pytest.raises(ValidationError, match="unknown cdiVersion"):
        CdiSpec(cdi_version="0.2.0", kind="v.com/c", devices=one())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "foo", "devices": [{"name": "a"}]}, "invalid CDI kind"),
        ({"kind": "v.com/c", "devices": []}, "at least 1 item"),
        ({"kind": "v.com/c", "devices": [{"name": "a"}, {"name": "a"}]}, "duplicate CDI device names: a"),
        (
            {"kind": "v.com/c", "devices": [{"name": "a", "containerEdits": {"env": ["NOEQUALS"]}}]},
            "NAME=value",
        ),
        (
            {
                "kind": "v.com/c",
                "devices": [
                    {"name": "a", "containerEdits": {"deviceNodes": [{"path": "/d", "permissions": "rx"}]}}
                ],
            },
            "permissions",
        ),
        (
            {
                "kind": "v.com/c",
                "devices": [
                    {"name": "a", "containerEdits": {"hooks": [{"hookName": "later", "path": "/h"}]}}
                ],
            },
            "hook_name|hookName",
        ),
        ({"kind": "v.com/c", "devices": [{"name": "a", "containerEdits": {"colour": "red"}}]}, "colour"),
    ],
    ids=["kind", "no-devices", "duplicates", "env", "permissions", "hook-name", "unknown-field"],
)
def test_invalid_specs(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CdiSpec.model_validate(data)


def test_a_full_spec_by_hand() -> None:
    spec = CdiSpec(
        kind="example.com/gpu",
        devices=(
            CdiDevice(
                name="gpu0",
                container_edits=ContainerEdits(
                    env=("GPU=0",),
                    device_nodes=(
                        DeviceNode(path="/dev/gpu0", type="c", major=195, minor=0, file_mode=0o666),
                    ),
                ),
            ),
            CdiDevice(name="gpu1"),
        ),
        container_edits=ContainerEdits(
            mounts=(
                CdiMount(
                    host_path="/usr/lib/libgpu.so",
                    container_path="/usr/lib/libgpu.so",
                    options=("ro", "bind"),
                ),
            ),
            hooks=(
                Hook(
                    hook_name="createContainer",
                    path="/usr/bin/gpu-hook",
                    args=("gpu-hook", "update"),
                    timeout=10,
                ),
            ),
        ),
    )
    assert spec.to_dict() == {
        "cdiVersion": "0.3.0",
        "kind": "example.com/gpu",
        "devices": [
            {
                "name": "gpu0",
                "containerEdits": {
                    "env": ["GPU=0"],
                    "deviceNodes": [
                        {"path": "/dev/gpu0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}
                    ],
                },
            },
            {"name": "gpu1", "containerEdits": {}},
        ],
        "containerEdits": {
            "mounts": [
                {
                    "hostPath": "/usr/lib/libgpu.so",
                    "containerPath": "/usr/lib/libgpu.so",
                    "options": ["ro", "bind"],
                }
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/gpu-hook",
                    "args": ["gpu-hook", "update"],
                    "timeout": 10,
                }
            ],
        },
    }
    text = spec.to_json()
    assert text.endswith("}\n") and list(json.loads(text)) == [
        "cdiVersion",
        "kind",
        "devices",
        "containerEdits",
    ]
    VALIDATOR.validate(json.loads(text))
    # Read back (camelCase keys), it is the same spec with its version pinned.
    assert CdiSpec.model_validate_json(text) == spec.model_copy(update={"cdi_version": "0.3.0"})


def test_the_schema_is_strict() -> None:
    good = CdiSpec(kind="v.com/c", devices=one()).to_dict()
    VALIDATOR.validate(good)
    for bad in (
        {**good, "extra": 1},
        {**good, "devices": [{"name": "a"}]},  # containerEdits missing
        {**good, "cdiVersion": "0.2.0"},
        {**good, "kind": "noslash"},
    ):
        assert not VALIDATOR.is_valid(bad), bad


# -- generated specs always validate ---------------------------------------------------------


def model(cls: type[Any], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Instances of a CDI model from strategies for its (Python-named) fields."""
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def tuples(elements: st.SearchStrategy[Any], max_size: int) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(elements, max_size=max_size).map(tuple)


names = st.sampled_from(["gpu0", "0", "a:b", "mig-1g.5gb", "x_y-z", "eth1"])
paths = st.sampled_from(["/dev/gpu0", "/a", "/usr/lib/x.so", "/run/sock/one"])
strings = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=8)
maybe = st.none
nodes = model(
    DeviceNode,
    path=paths,
    host_path=maybe() | paths,
    type=maybe() | st.sampled_from(["b", "c", "u", "p"]),
    major=maybe() | st.integers(0, 511),
    file_mode=maybe() | st.integers(0, 0o777),
    permissions=maybe() | st.sampled_from(["r", "rw", "rwm", "mw"]),
    uid=maybe() | st.integers(0, 65535),
)
mounts = model(
    CdiMount,
    host_path=paths,
    container_path=paths,
    options=tuples(strings, 2),
    type=maybe() | st.sampled_from(["bind", "tmpfs"]),
)
edits = model(
    ContainerEdits,
    env=tuples(st.sampled_from(["A=1", "PATH_X=", "B=c=d"]), 3),
    device_nodes=tuples(nodes, 2),
    mounts=tuples(mounts, 2),
    hooks=tuples(model(Hook, hook_name=st.sampled_from(["prestart", "poststop"]), path=paths), 1),
    additional_gids=tuples(st.integers(0, 2**32 - 1), 2),
    intel_rdt=maybe() | model(IntelRdt, clos_id=maybe() | strings, schemata=tuples(strings, 1)),
    net_devices=tuples(model(NetDevice, host_interface_name=names, name=names), 1),
)
devices = model(
    CdiDevice, name=names, annotations=st.dictionaries(strings, strings, max_size=2), container_edits=edits
)


@settings(max_examples=200)
@given(
    kind=st.sampled_from(["vendor.com/gpu", "a/b", "x.io/c.d"]),
    devs=st.lists(devices, min_size=1, max_size=3, unique_by=lambda d: d.name),
    shared=edits,
)
def test_generated_specs_validate_against_the_schema(
    kind: str, devs: list[CdiDevice], shared: ContainerEdits
) -> None:
    spec = CdiSpec(kind=kind, devices=tuple(devs), container_edits=shared)
    document = json.loads(spec.to_json())
    VALIDATOR.validate(document)
    again = CdiSpec.model_validate(document)
    assert again.required_version() == spec.required_version() == document["cdiVersion"]
