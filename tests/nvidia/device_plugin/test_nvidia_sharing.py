"""Time-slicing and MPS replicas: config → resources and replica lists, renames, device subsets,
failRequestsGreaterThanOne, Allocate mapping replicas back to devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from devplug import Device, Health
from devplug.errors import ConfigError
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._cli._main import build_plugins
from devplug_nvidia._config._file import Sharing
from devplug_nvidia._device_plugin._sharing import SharedResource, apply_sharing
from devplug_nvidia._gpu._model import GpuRecord
from devplug_nvidia.discovery import MigStrategy
from devplug_nvidia.plugin import NvidiaPlugin
from devplug_nvidia.testing import fake_nvml
from tests.nvidia.nvidia_health_kit import discovered

GPU = "nvidia.com/gpu"
MIG_SMALL = "nvidia.com/mig-1g.5gb"


def machine(model: str, tmp_path: Path, strategy: MigStrategy = "none") -> dict[str, list[GpuRecord]]:
    return discovered(fake_nvml(model), tmp_path, strategy)


def sharing(section: str = "timeSlicing", **fields: Any) -> Sharing:
    resources = fields.pop("resources", [{"name": GPU, "replicas": 4}])
    return Sharing.model_validate({section: {"resources": resources, **fields}})


def layout(resources: dict[str, SharedResource]) -> dict[str, tuple[int, list[int]]]:
    """name → (devices, replica counts of the shared ones in order)."""
    return {
        name: (len(r.records), [r.replicas_of(rec) for rec in r.records if rec.uuid in r.replicas])
        for name, r in sorted(resources.items())
    }


def test_no_sharing_keeps_discovery(tmp_path: Path) -> None:
    got = apply_sharing(machine("dgx-a100", tmp_path), Sharing())
    assert layout(got) == {GPU: (8, [])}
    assert got[GPU].strategy == "none" and not got[GPU].shared


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {GPU: (8, [4] * 8)}),
        ({"renameByDefault": True}, {f"{GPU}.shared": (8, [4] * 8)}),
        (
            {"resources": [{"name": GPU, "rename": "gpu-ts", "replicas": 3}]},
            {"nvidia.com/gpu-ts": (8, [3] * 8)},
        ),
        # An explicit rename beats renameByDefault.
        (
            {"renameByDefault": True, "resources": [{"name": GPU, "rename": "x", "replicas": 2}]},
            {"nvidia.com/x": (8, [2] * 8)},
        ),
        # A count: the first N devices are shared, the rest stay whole under the old name.
        (
            {"resources": [{"name": GPU, "devices": 2, "replicas": 5}], "renameByDefault": True},
            {GPU: (6, []), f"{GPU}.shared": (2, [5, 5])},
        ),
        # No rename: replicas and whole GPUs under one name (upstream's behaviour).
        ({"resources": [{"name": GPU, "devices": [0, "3"], "replicas": 2}]}, {GPU: (8, [2, 2])}),
        # Two entries on one resource: different subsets, names and replica counts.
        (
            {
                "resources": [
                    {"name": GPU, "devices": [0, 1], "rename": "small", "replicas": 8},
                    {"name": GPU, "devices": [2], "rename": "big", "replicas": 2},
                ]
            },
            {GPU: (5, []), "nvidia.com/big": (1, [2]), "nvidia.com/small": (2, [8, 8])},
        ),
    ],
)
def test_time_slicing_layouts(tmp_path: Path, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    got = apply_sharing(machine("dgx-a100", tmp_path), sharing(**fields))
    assert layout(got) == expected
    assert all(r.strategy == "time-slicing" for r in got.values())


def test_devices_by_uuid_keep_the_listed_order(tmp_path: Path) -> None:
    found = machine("dgx-a100", tmp_path)
    uuids = [found[GPU][5].uuid, found[GPU][1].uuid]
    got = apply_sharing(
        found, sharing(resources=[{"name": GPU, "devices": uuids, "rename": "s", "replicas": 2}])
    )
    assert [r.uuid for r in got["nvidia.com/s"].records] == uuids


def test_mig_devices_by_index_and_uuid(tmp_path: Path) -> None:
    found = machine("mig-mixed", tmp_path, "mixed")
    small = found[MIG_SMALL]
    mig = small[4].mig
    assert mig is not None
    legacy = f"MIG-{mig.parent_uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}"
    refs = [small[0].index, small[2].uuid, legacy]
    got = apply_sharing(found, sharing(resources=[{"name": MIG_SMALL, "devices": refs, "replicas": 3}]))
    shared = got[MIG_SMALL]
    assert len(shared.records) == 7
    # The whole devices first, then the shared ones in the order the entry names them.
    assert [r.uuid for r in shared.records[4:]] == [small[0].uuid, small[2].uuid, small[4].uuid]
    assert set(shared.replicas) == {small[0].uuid, small[2].uuid, small[4].uuid}


def test_mps_layout_and_fail_requests_default(tmp_path: Path) -> None:
    got = apply_sharing(machine("pcie-a10", tmp_path), sharing("mps", renameByDefault=True))
    assert layout(got) == {f"{GPU}.shared": (4, [4] * 4)}
    assert got[f"{GPU}.shared"].strategy == "mps"
    assert got[f"{GPU}.shared"].fail_requests_greater_than_one is True
    ts = apply_sharing(machine("pcie-a10", tmp_path), sharing())
    assert ts[GPU].fail_requests_greater_than_one is False
    on = apply_sharing(machine("pcie-a10", tmp_path), sharing(failRequestsGreaterThanOne=True))
    assert on[GPU].fail_requests_greater_than_one is True


@pytest.mark.parametrize(
    ("model", "strategy", "section", "resources", "message"),
    [
        (
            "pcie-a10",
            "none",
            "timeSlicing",
            [{"name": GPU, "devices": 5, "replicas": 2}],
            "requested 5 devices to be replicated, but only 4 devices available",
        ),
        (
            "pcie-a10",
            "none",
            "timeSlicing",
            [{"name": GPU, "devices": [7], "replicas": 2}],
            "no matching device at index: 7",
        ),
        (
            "pcie-a10",
            "none",
            "timeSlicing",
            [{"name": GPU, "devices": ["GPU-00000000-0000-0000-0000-000000000000"], "replicas": 2}],
            "no matching device with UUID: GPU-00000000-0000-0000-0000-000000000000",
        ),
        (
            "pcie-a10",
            "none",
            "timeSlicing",
            [
                {"name": GPU, "devices": [0, 1], "rename": "a", "replicas": 2},
                {"name": GPU, "devices": [1], "rename": "b", "replicas": 2},
            ],
            "is already shared by sharing.timeSlicing.resources[0]",
        ),
        (
            "mig-uniform",
            "single",
            "mps",
            [{"name": GPU, "replicas": 2}],
            "sharing using MPS is not supported for MIG devices",
        ),
    ],
)
def test_config_errors_name_the_entry(  # noqa: PLR0917 - one parameter per table column
    tmp_path: Path, model: str, strategy: MigStrategy, section: str, resources: list[Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"resources\[\d\] \(nvidia.com/gpu\)") as info:
        apply_sharing(machine(model, tmp_path, strategy), sharing(section, resources=resources))
    assert message in str(info.value)


def test_an_entry_for_a_resource_not_on_this_node_is_logged(tmp_path: Path) -> None:
    with capture_logs() as logs:
        got = apply_sharing(
            machine("pcie-a10", tmp_path), sharing(resources=[{"name": "gpus", "replicas": 2}])
        )
    assert layout(got) == {GPU: (4, [])}
    (warning,) = [e for e in logs if e["event"] == "sharing_resource_not_found"]
    assert warning["resource"] == "nvidia.com/gpus" and warning["found"] == [GPU]


# -- the plugins built from the shared resources ----------------------------------------------


def plugins_for(tmp_path: Path, model: str = "dgx-a100", **config: Any) -> dict[str, NvidiaPlugin]:
    settings = NvidiaSettings.model_validate(config)
    resources = apply_sharing(machine(model, tmp_path, settings.mig_strategy), settings.sharing)
    built = build_plugins(resources, settings, present=frozenset(), imex=())
    return {p.resource_name: p for p in built}


def test_replica_ids_and_numa(tmp_path: Path) -> None:
    plugins = plugins_for(
        tmp_path, sharing=sharing(renameByDefault=True, resources=[{"name": GPU, "replicas": 2}])
    )
    assert list(plugins) == [f"{GPU}.shared"]
    plugin = plugins[f"{GPU}.shared"]
    devices = plugin.devices()
    records = plugin.records
    assert [d.id for d in devices[:4]] == [
        f"{records[0].uuid}::0",
        f"{records[0].uuid}::1",
        f"{records[1].uuid}::0",
        f"{records[1].uuid}::1",
    ]
    assert [d.numa_nodes for d in devices[::2]] == [(3,), (3,), (1,), (1,), (7,), (7,), (5,), (5,)]
    assert all(d.health is Health.HEALTHY for d in devices)


def test_index_strategy_replicas(tmp_path: Path) -> None:
    plugins = plugins_for(
        tmp_path,
        "pcie-a10",
        device_id_strategy="index",
        sharing=sharing(resources=[{"name": GPU, "replicas": 2}]),
    )
    assert [d.id for d in plugins[GPU].devices()] == [
        "0::0",
        "0::1",
        "1::0",
        "1::1",
        "2::0",
        "2::1",
        "3::0",
        "3::1",
    ]


def test_subset_lists_replicas_and_whole_gpus(tmp_path: Path) -> None:
    plugins = plugins_for(
        tmp_path,
        "pcie-a10",
        device_id_strategy="index",
        sharing=sharing(resources=[{"name": GPU, "devices": [2], "replicas": 3}]),
    )
    assert [d.id for d in plugins[GPU].devices()] == ["0", "1", "3", "2::0", "2::1", "2::2"]


async def _allocate(plugin: NvidiaPlugin, ids: list[str]) -> Any:
    return await plugin.allocate([Device(id=i) for i in ids])


@pytest.mark.anyio
async def test_allocate_maps_replicas_back_to_gpus(tmp_path: Path) -> None:
    plugins = plugins_for(tmp_path, "pcie-a10", sharing=sharing(resources=[{"name": GPU, "replicas": 4}]))
    plugin = plugins[GPU]
    uuid = plugin.records[1].uuid
    got = await _allocate(plugin, [f"{uuid}::3"])
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
    # Time-slicing does not fail requests above one by default: replicas collapse to their GPU.
    other = plugin.records[2].uuid
    got = await _allocate(plugin, [f"{uuid}::0", f"{uuid}::2", f"{other}::1"])
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid},{other}"


@pytest.mark.parametrize("section", ["timeSlicing", "mps"])
def test_fail_requests_greater_than_one_has_upstreams_text(tmp_path: Path, section: str) -> None:
    fields: dict[str, Any] = {"failRequestsGreaterThanOne": True} if section == "timeSlicing" else {}
    plugin = plugins_for(
        tmp_path, "pcie-a10", mps_root="/run/nvidia/mps", sharing=sharing(section, **fields)
    )[GPU]
    uuid = plugin.records[0].uuid
    with pytest.raises(ValueError, match="maximum request size") as info:
        plugin.validate_request([f"{uuid}::0", f"{uuid}::1"])
    assert str(info.value) == "invalid request: maximum request size for shared resources is 1; found 2"
    assert plugin.validate_request([f"{uuid}::1"]) == [plugin.records[0]]


def test_fail_requests_only_concerns_replicas(tmp_path: Path) -> None:
    plugin = plugins_for(
        tmp_path,
        "pcie-a10",
        sharing=sharing(
            failRequestsGreaterThanOne=True, resources=[{"name": GPU, "devices": [0], "replicas": 2}]
        ),
    )[GPU]
    whole = [r.uuid for r in plugin.records[:2]]
    assert len(plugin.validate_request(whole)) == 2


def test_unknown_device_has_upstreams_text(tmp_path: Path) -> None:
    plugin = plugins_for(tmp_path, "pcie-a10", sharing=sharing())[GPU]
    with pytest.raises(ValueError, match=r"^invalid request: unknown device: GPU-nope::0$"):
        plugin.validate_request(["GPU-nope::0"])
