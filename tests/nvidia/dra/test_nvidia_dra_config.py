"""NVIDIA's opaque DRA configs: decoding, quantities, checks, which config applies to which
device, MPS limits, and the feature gates (nvidia-dra.md §5, §7)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devplug.errors import ConfigError
from devplug.models import AllocatedDevice, Claim, Device, OpaqueConfig
from devplug_nvidia._config._feature_gates import FeatureGateError, parse_feature_gates
from devplug_nvidia._dra._config import (
    GpuConfig,
    MigDeviceConfig,
    OpaqueConfigError,
    Quantity,
    VfioDeviceConfig,
    decode_config,
)
from devplug_nvidia._dra._groups import group_results, opaque_configs, pinned_limits, prepared_config
from devplug_nvidia.config import load_nvidia_settings

API = "resource.nvidia.com/v1beta1"
ON = {"TimeSlicingSettings": True, "MPSSupport": True}
SCHEME = "sigs.k8s.io/dra-driver-nvidia-gpu/api/nvidia.com/resource/v1beta1/api.go:63"


def gpu(sharing: Any = None, kind: str = "GpuConfig", **more: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, **({"sharing": sharing} if sharing is not None else {}), **more}


# -- decoding ------------------------------------------------------------------------------------


def test_a_full_gpu_config_decodes_with_every_field() -> None:
    config = decode_config(
        gpu(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-a": 1048576},
                },
            }
        )
    )
    assert isinstance(config, GpuConfig)
    assert config.sharing is not None and config.sharing.mps_config is not None
    mps = config.sharing.mps_config
    assert mps.default_active_thread_percentage == 50
    assert mps.default_pinned_device_memory_limit == Quantity("10Gi", 10 * 2**30)
    assert mps.default_per_device_pinned_memory_limit == {
        "0": Quantity("5Gi", 5 * 2**30),
        "GPU-a": Quantity("1048576", 2**20),
    }


def test_mig_and_vfio_configs_decode() -> None:
    mig = decode_config(gpu({"strategy": "MPS", "mpsConfig": {}}, kind="MigDeviceConfig"))
    assert isinstance(mig, MigDeviceConfig) and mig.sharing is not None
    vfio = decode_config(gpu(kind="VfioDeviceConfig", iommu={"backendPolicy": "PreferIommuFD"}))
    assert isinstance(vfio, VfioDeviceConfig) and vfio.iommu is not None
    assert vfio.iommu.backend_policy == "PreferIommuFD"


def test_null_leaves_a_field_unset_as_go_does() -> None:
    config = decode_config(gpu({"strategy": "TimeSlicing", "timeSlicingConfig": None, "mpsConfig": None}))
    assert isinstance(config, GpuConfig) and config.sharing is not None
    assert (config.sharing.time_slicing_config, config.sharing.mps_config) == (None, None)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (gpu({"strategy": "MPS", "foo": 1}), 'strict decoding error: unknown field "sharing.foo"'),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"bar": 1}}, extra=None),
            'strict decoding error: unknown field "sharing.mpsConfig.bar", unknown field "extra"',
        ),
        # Go's decoder for Kubernetes objects is case-sensitive in strict mode.
        (gpu({"Strategy": "MPS"}), 'strict decoding error: unknown field "sharing.Strategy"'),
        (
            gpu({"strategy": "TimeSlicing"}, kind="MigDeviceConfig") | {"sharing": {"timeSlicingConfig": {}}},
            'strict decoding error: unknown field "sharing.timeSlicingConfig"',
        ),
        (gpu(metadata={"name": "x"}), 'strict decoding error: unknown field "metadata"'),
        (
            gpu({"strategy": 5}),
            "json: cannot unmarshal number into Go struct field GpuSharing.sharing.strategy "
            "of type v1beta1.GpuSharingStrategy",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50.5}}),
            "json: cannot unmarshal number 50.5 into Go struct field "
            "MpsConfig.sharing.mpsConfig.defaultActiveThreadPercentage of type int",
        ),
        (
            gpu("MPS"),
            "json: cannot unmarshal string into Go struct field GpuConfig.sharing of type v1beta1.GpuSharing",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10GB"}}),
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            f'no kind "GpuConfig" is registered for version "resource.nvidia.com/v1" in scheme "{SCHEME}"',
        ),
        (
            {"apiVersion": API, "kind": "DeviceConfig"},
            f'no kind "DeviceConfig" is registered for version "{API}" in scheme "{SCHEME}"',
        ),
        (
            {"apiVersion": API},
            "Object 'Kind' is missing in '{\"apiVersion\":\"resource.nvidia.com/v1beta1\"}'",
        ),
        ({"kind": "GpuConfig"}, "Object 'apiVersion' is missing in '{\"kind\":\"GpuConfig\"}'"),
        ({"apiVersion": "a/b/c", "kind": "GpuConfig"}, "unexpected GroupVersion string: a/b/c"),
    ],
)
def test_decoding_errors_read_as_nvidia_s(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(OpaqueConfigError) as info:
        decode_config(parameters)
    assert str(info.value) == f"error decoding config parameters: {message}"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", 10 * 2**30),
        ("1M", 10**6),
        ("1.5Ki", 1536),
        ("1e3", 1000),
        ("100m", 1),  # rounded up, as Quantity.Value()
        ("0", 0),
        (" 2Mi ", 2 * 2**20),
    ],
)
def test_quantities_parse_as_kubernetes_does(text: str, value: int) -> None:
    assert Quantity.parse(text).value == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "quantities must match"),
        ("1Gb", "quantities must match"),
        ("1Gi5", "unable to parse quantity's suffix"),
        (True, "quantities must match"),
    ],
)
def test_bad_quantities(text: object, message: str) -> None:
    with pytest.raises(OpaqueConfigError, match=message):
        Quantity.parse(text)


@given(st.integers(min_value=0, max_value=2**50))
def test_megabytes_are_the_integer_mib(value: int) -> None:
    text, valid = Quantity(str(value), value).megabytes()
    assert text == f"{value // 2**20}M"
    assert valid == (value >= 2**20)


# -- Normalize and Validate ----------------------------------------------------------------------


def test_a_missing_or_empty_time_slicing_block_becomes_default() -> None:
    for sharing in ({"strategy": "TimeSlicing"}, {"strategy": "TimeSlicing", "timeSlicingConfig": {}}):
        config = prepared_config(decode_config(gpu(sharing)), ON)
        assert isinstance(config, GpuConfig) and config.sharing is not None
        assert config.sharing.time_slicing_config is not None
        assert config.sharing.time_slicing_config.interval == "Default"


def test_mps_without_its_block_gets_an_empty_one() -> None:
    config = prepared_config(decode_config(gpu({"strategy": "MPS"}, kind="MigDeviceConfig")), ON)
    assert isinstance(config, MigDeviceConfig) and config.sharing is not None
    assert config.sharing.mps_config is not None


@pytest.mark.parametrize(
    ("sharing", "gates", "message"),
    [
        (
            {"strategy": "TimeSlicing"},
            {"MPSSupport": True},
            '"TimeSlicing" is selected as the GPU sharing strategy, but the "TimeSlicingSettings" '
            "feature gate is not enabled",
        ),
        (
            {"strategy": "MPS"},
            {},
            '"MPS" is selected as the GPU sharing strategy, but the "MPSSupport" feature gate is not enabled',
        ),
        ({}, ON, "unknown GPU sharing strategy: , supported GPU sharing strategies: TimeSlicing, MPS"),
        (
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "long"}},
            ON,
            "unknown time-slice interval: long, supported time-slice intervals: Default, Short, Medium, Long",
        ),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}},
            ON,
            "active thread percentage must not be negative",
        ),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}},
            ON,
            "active thread percentage must not be greater than 100",
        ),
    ],
)
def test_validation_messages(sharing: dict[str, Any], gates: dict[str, bool], message: str) -> None:
    with pytest.raises(OpaqueConfigError) as info:
        prepared_config(decode_config(gpu(sharing)), gates)
    assert str(info.value) == f"error validating GPU config: {message}"


def test_a_config_without_sharing_needs_no_gate() -> None:
    config = decode_config(gpu())
    assert prepared_config(config, {}) == config


# -- which config applies ------------------------------------------------------------------------


def _allocated(request: str, name: str) -> AllocatedDevice:
    return AllocatedDevice(request=request, name=name, pool="node", device=Device(id=name, name=name))


TYPES = {"gpu-0": "gpu", "gpu-1": "gpu", "gpu-2-mig-1g5gb-0-0": "mig"}


def _claim(configs: list[dict[str, Any]]) -> Claim:
    return Claim(
        uid="u",
        namespace="ns",
        name="c",
        resource_claim={"status": {"allocation": {"devices": {"results": [], "config": configs}}}},
    )


def _opaque(
    parameters: dict[str, Any], source: str = "FromClaim", requests: list[str] | None = None
) -> dict[str, Any]:
    return {
        "source": source,
        **({"requests": requests} if requests else {}),
        "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
    }


def test_configs_are_read_class_first_other_drivers_skipped() -> None:
    claim = _claim(
        [
            _opaque(gpu({"strategy": "MPS"})),
            {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"x": 1}}},
            _opaque(gpu({"strategy": "TimeSlicing"}), source="FromClass"),
        ]
    )
    entries = opaque_configs("gpu.nvidia.com", claim.resource_claim, [])
    kinds = [(type(e.config).__name__, getattr(e.config, "sharing", None)) for e in entries]
    assert [k for k, _ in kinds] == ["MigDeviceConfig", "GpuConfig", "GpuConfig", "GpuConfig"]
    assert [s.strategy if s else None for _, s in kinds] == [None, None, "TimeSlicing", "MPS"]


def test_without_the_claim_object_the_given_configs_are_used() -> None:
    given_ = [OpaqueConfig(source="FromClaim", requests=("a",), parameters=gpu({"strategy": "MPS"}))]
    entries = opaque_configs("gpu.nvidia.com", None, given_)
    assert entries[-1].requests == ("a",)


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ([{"source": "FromClaim"}], "only opaque parameters are supported by this driver"),
        ([{"source": "FromPod", "opaque": {}}], "invalid config source: FromPod"),
        (
            [_opaque({"kind": "GpuConfig"})],
            "error decoding config parameters: Object 'apiVersion' is missing",
        ),
    ],
)
def test_config_errors_name_nvidia_s_step(configs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(OpaqueConfigError) as info:
        opaque_configs("gpu.nvidia.com", _claim(configs).resource_claim, [])
    assert str(info.value).startswith(f"error getting opaque device configs: {message}")


def _groups(configs: list[dict[str, Any]], devices: list[AllocatedDevice]) -> list[tuple[str, list[str]]]:
    entries = opaque_configs("gpu.nvidia.com", _claim(configs).resource_claim, [])
    groups = group_results(entries, devices, TYPES.__getitem__)
    return [
        (
            f"{type(g.config).__name__}:{getattr(getattr(g.config, 'sharing', None), 'strategy', '-')}",
            [d.name for d in g.devices],
        )
        for g in groups
    ]


def test_results_sharing_a_config_form_one_group() -> None:
    devices = [_allocated("a", "gpu-0"), _allocated("b", "gpu-1"), _allocated("a", "gpu-2-mig-1g5gb-0-0")]
    groups = _groups([_opaque(gpu({"strategy": "MPS"}))], devices)
    assert groups == [("GpuConfig:MPS", ["gpu-0", "gpu-1"]), ("MigDeviceConfig:-", ["gpu-2-mig-1g5gb-0-0"])]


def test_a_config_naming_a_request_is_exact_and_must_suit_the_device_type() -> None:
    devices = [_allocated("a/small", "gpu-0"), _allocated("b", "gpu-2-mig-1g5gb-0-0")]
    # "a" does not name the subrequest "a/small": the built-in GpuConfig serves gpu-0.
    assert _groups([_opaque(gpu({"strategy": "MPS"}), requests=["a"])], devices[:1]) == [
        ("GpuConfig:-", ["gpu-0"])
    ]
    with pytest.raises(OpaqueConfigError) as info:
        _groups([_opaque(gpu({"strategy": "MPS"}), requests=["b"])], devices)
    assert (
        str(info.value) == 'cannot apply GpuConfig to device "gpu-2-mig-1g5gb-0-0" of type "mig" (request: b)'
    )
    with pytest.raises(
        OpaqueConfigError, match=r'cannot apply MigDeviceConfig to device "gpu-0" of type "gpu"'
    ):
        _groups([_opaque(gpu(kind="MigDeviceConfig"), requests=["a/small"])], devices)
    # A VfioDeviceConfig never fits a GPU or MIG device (devplug publishes no vfio devices).
    with pytest.raises(
        OpaqueConfigError, match=r'cannot apply VfioDeviceConfig to device "gpu-0" of type "gpu"'
    ):
        _groups([_opaque(gpu(kind="VfioDeviceConfig"), requests=["a/small"])], devices)
    assert _groups([_opaque(gpu(kind="VfioDeviceConfig"))], devices[:1]) == [("GpuConfig:-", ["gpu-0"])]


def test_a_dynamic_mig_device_is_named_migdyn_and_takes_mig_device_configs() -> None:
    entries = opaque_configs(
        "gpu.nvidia.com",
        _claim([_opaque(gpu({"strategy": "MPS"}, kind="MigDeviceConfig"))]).resource_claim,
        [],
    )
    groups = group_results(entries, [_allocated("a", "gpu-0-mig-1g5gb-19-0")], lambda _: "migdyn")
    assert isinstance(groups[0].config, MigDeviceConfig) and groups[0].config.sharing is not None
    entries = opaque_configs(
        "gpu.nvidia.com", _claim([_opaque(gpu({"strategy": "MPS"}), requests=["a"])]).resource_claim, []
    )
    with pytest.raises(OpaqueConfigError) as info:
        group_results(entries, [_allocated("a", "gpu-0-mig-1g5gb-19-0")], lambda _: "migdyn")
    assert str(info.value) == (
        'cannot apply GpuConfig to device "gpu-0-mig-1g5gb-19-0" of type "migdyn" (request: a)'
    )


def test_a_compute_domain_kind_is_taken_and_then_refused() -> None:
    entries = opaque_configs(
        "gpu.nvidia.com", _claim([_opaque(gpu(kind="ComputeDomainChannelConfig"))]).resource_claim, []
    )
    groups = group_results(entries, [_allocated("a", "gpu-0")], TYPES.__getitem__)
    with pytest.raises(OpaqueConfigError, match=r"^runtime object is not a recognized configuration$"):
        prepared_config(groups[0].config, ON)


# -- MPS limits ----------------------------------------------------------------------------------


def _mps(**fields: Any) -> Any:
    config = decode_config(gpu({"strategy": "MPS", "mpsConfig": fields}))
    assert isinstance(config, GpuConfig) and config.sharing is not None
    return config.sharing.mps_config


def test_limits_per_uuid_and_per_index_of_the_sorted_uuids() -> None:
    uuids = ["GPU-a", "GPU-b", "GPU-c"]
    limits = pinned_limits(
        _mps(
            defaultPinnedDeviceMemoryLimit="1Gi",
            defaultPerDevicePinnedMemoryLimit={"2": "2Gi", "GPU-b": "1536Ki", "+0": "3Mi"},
        ),
        uuids,
    )
    assert limits == {"GPU-a": "3M", "GPU-b": "1M", "GPU-c": "2048M"}
    assert pinned_limits(_mps(), uuids) == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}, "invalid device: invalid device index: 3"),
        ({"defaultPerDevicePinnedMemoryLimit": {"-1": "1Gi"}}, "invalid device: invalid device index: -1"),
        (
            {"defaultPerDevicePinnedMemoryLimit": {"GPU-x": "1Gi"}},
            "invalid device: unable to parse key as an integer: GPU-x",
        ),
        (
            {"defaultPerDevicePinnedMemoryLimit": {"0": "1000Ki"}},
            "invalid limit: value set too low: 0: 1000Ki",
        ),
        ({"defaultPinnedDeviceMemoryLimit": "1M"}, "invalid limit: default value set too low: 1M"),
    ],
)
def test_limit_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OpaqueConfigError) as info:
        pinned_limits(_mps(**fields), ["GPU-a", "GPU-b"])
    assert str(info.value) == message


# -- feature gates -------------------------------------------------------------------------------


def test_gates_default_to_nvidia_s() -> None:
    gates = parse_feature_gates("")
    assert {n for n, on in gates.items() if on} == {
        "IMEXDaemonsWithDNSNames",
        "ComputeDomainCliques",
        "CrashOnNVLinkFabricErrors",
        "ContextualLogging",
        "LoggingBetaOptions",
    }


@pytest.mark.parametrize(
    ("text", "on", "off"),
    [
        ("MPSSupport=true,TimeSlicingSettings=True", {"MPSSupport", "TimeSlicingSettings"}, {"DynamicMIG"}),
        (" MPSSupport = 1 ,", {"MPSSupport"}, {"TimeSlicingSettings"}),
        ("AllAlpha=true,DynamicMIG=false,PassthroughSupport=false", {"MPSSupport", "DeviceMetadata"}, set()),
        ("AllBeta=false", set(), {"ComputeDomainCliques", "ContextualLogging"}),
    ],
)
def test_gates_parse_as_kubernetes_does(text: str, on: set[str], off: set[str]) -> None:
    if "AllAlpha" in text:
        with pytest.raises(FeatureGateError, match="DeviceMetadata requires PassthroughSupport"):
            parse_feature_gates(text)
        text += ",DeviceMetadata=false,NVMLDeviceHealthCheck=true"
        on = {"MPSSupport", "NVMLDeviceHealthCheck"}
    gates = parse_feature_gates(text)
    assert all(gates[n] for n in on) and not any(gates[n] for n in off)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Foo=true", "unrecognized feature gate: Foo"),
        ("MPSSupport", "missing bool value for MPSSupport"),
        (
            "MPSSupport=yes",
            'invalid value of MPSSupport=yes, err: strconv.ParseBool: parsing "yes": invalid syntax',
        ),
        (
            "DynamicMIG=true,MPSSupport=true",
            "feature gate validation failed: feature gate DynamicMIG is currently mutually exclusive "
            "with MPSSupport",
        ),
        (
            "PassthroughSupport=true,NVMLDeviceHealthCheck=true",
            "feature gate validation failed: feature gate PassthroughSupport is currently mutually exclusive "
            "with NVMLDeviceHealthCheck",
        ),
    ],
)
def test_bad_gates(text: str, message: str) -> None:
    with pytest.raises(FeatureGateError) as info:
        parse_feature_gates(text)
    assert str(info.value) == message


def test_settings_read_the_flag_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_nvidia_settings(["--feature-gates", "MPSSupport=true"])
    assert settings.gate_enabled("MPSSupport") and not settings.gate_enabled("TimeSlicingSettings")
    monkeypatch.setenv("FEATURE_GATES", "TimeSlicingSettings=true")
    settings = load_nvidia_settings([])
    assert settings.gates["TimeSlicingSettings"]
    with pytest.raises(TypeError):
        settings.gates["MPSSupport"] = True  # type: ignore[index]
    with pytest.raises(ConfigError) as info:
        load_nvidia_settings(["--feature-gates=Foo=true"])
    assert (
        str(info.value) == 'invalid value "Foo=true" for flag --feature-gates: unrecognized feature gate: Foo'
    )


def test_an_unknown_gate_exits_2_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug_nvidia", "--api", "dra", "--feature-gates", "NoSuchGate=true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        'devplug-nvidia: invalid value "NoSuchGate=true" for flag --feature-gates: '
        "unrecognized feature gate: NoSuchGate"
    ]
