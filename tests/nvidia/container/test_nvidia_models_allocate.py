"""Discovery on every fake machine model, then Allocate for every device-list strategy x ID
strategy (x MIG strategy where the model has MIG), checked field by field against nvidia.md §3."""

from __future__ import annotations

import posixpath
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug import DeviceSpec, Mount
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._container._allocate import build_allocation, present_nodes
from devplug_nvidia.discovery import discover
from devplug_nvidia.testing import MODELS, write_root

if TYPE_CHECKING:
    from devplug_nvidia._gpu._model import GpuRecord

LIST_STRATEGIES = [
    ("envvar",),
    ("volume-mounts",),
    ("cdi-annotations",),
    ("cdi-cri",),
    ("envvar", "volume-mounts"),
    ("envvar", "cdi-cri"),
    ("volume-mounts", "cdi-annotations"),
    ("cdi-annotations", "cdi-cri"),
]
ID_STRATEGIES = ["uuid", "index"]
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
KIND = "k8s.device-plugin.nvidia.com/gpu"


def _mig_strategies(name: str) -> list[str]:
    gpus = MODELS[name].gpus
    if not any(g.mig_enabled for g in gpus):
        return ["none"]
    single_ok = all(g.mig_enabled and g.mig_instances for g in gpus) and (
        len({(i.gi_profile_id, i.ci_slices) for g in gpus for i in g.mig_instances}) == 1
    )
    return ["none", "mixed", *(["single"] if single_ok else [])]


CASES = [(m, s) for m in sorted(MODELS) for s in _mig_strategies(m)]


@cache
def _root(model: str) -> Path:
    import tempfile

    return write_root(MODELS[model], Path(tempfile.mkdtemp(prefix=f"devplug-{model}-")))


@cache
def _resources(model: str, mig: str) -> dict[str, list[GpuRecord]]:
    settings = NvidiaSettings.model_validate(
        {"fake_nvml": model, "driver_root": str(_root(model)), "mig_strategy": mig}
    )
    return discover(settings)


def _expected_nodes(record: GpuRecord) -> list[str]:
    """§2/§3: /dev/nvidia<minor> of the GPU (MIG: of the parent) plus, for MIG, the GI and CI caps."""
    nodes = [f"/dev/nvidia{record.minor}"]
    if record.mig is not None:
        assert record.minor == record.mig.parent_minor
        assert len(record.mig.cap_paths) == 2
        nodes += list(record.mig.cap_paths)
    return nodes


@pytest.mark.parametrize(("model", "mig"), CASES)
def test_resources_per_strategy(model: str, mig: str) -> None:
    resources = _resources(model, mig)
    gpus = MODELS[model].gpus
    records = [r for rs in resources.values() for r in rs]
    if mig == "none":
        assert list(resources) == ["nvidia.com/gpu"]
        assert len(records) == len(gpus)
        assert all(r.kind == "gpu" for r in records)
    elif mig == "single":
        assert list(resources) == ["nvidia.com/gpu"]
        assert all(r.kind == "mig" for r in records)
    else:
        plain = sum(not g.mig_enabled for g in gpus)
        assert len(resources.get("nvidia.com/gpu", [])) == plain
        assert all(
            name.startswith("nvidia.com/mig-") and all(r.kind == "mig" for r in rs)
            for name, rs in resources.items()
            if name != "nvidia.com/gpu"
        )
    ids = [r.uuid for r in records]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("model", "mig"), CASES)
@pytest.mark.parametrize("id_strategy", ID_STRATEGIES)
@pytest.mark.parametrize("lists", LIST_STRATEGIES, ids="+".join)
def test_allocate_matches_the_tables(model: str, mig: str, id_strategy: str, lists: tuple[str, ...]) -> None:
    root = _root(model)
    present = present_nodes(root)
    assert present == set(CONTROL)  # write_root makes all four control nodes
    for pass_specs in (False, True):
        config = NvidiaSettings.model_validate(
            {
                "device_list_strategy": list(lists),
                "device_id_strategy": id_strategy,
                "pass_device_specs": pass_specs,
                "driver_root": str(root),
            }
        )
        for resource, records in _resources(model, mig).items():
            picked = records[:2]
            request = [*picked, picked[0]]  # a repeated ID (e.g. two replicas) is sent once
            got = build_allocation(request, config, resource_name=resource, present=present, response_id="r")
            _check(got, picked=picked, config=config, lists=lists, id_strategy=id_strategy, root=root)


def _check(
    got: object,
    *,
    picked: list[GpuRecord],
    config: NvidiaSettings,
    lists: tuple[str, ...],
    id_strategy: str,
    root: Path,
) -> None:
    from devplug import ContainerAllocation

    assert isinstance(got, ContainerAllocation)
    ids = [r.uuid if id_strategy == "uuid" else r.index for r in picked]
    if id_strategy == "index":
        assert all(i.isdigit() or (i.count(":") == 1) for i in ids)
    else:
        assert all(i.startswith(("GPU-", "MIG-")) for i in ids)
    cdi_names = tuple(f"{KIND}={i}" for i in ids)
    cdi_only = set(lists) <= {"cdi-annotations", "cdi-cri"}

    # CDI
    if "cdi-annotations" in lists:
        assert got.annotations == {"cdi.k8s.io/nvidia-device-plugin_r": ",".join(cdi_names)}
    else:
        assert got.annotations == {}
    assert got.cdi_devices == (cdi_names if "cdi-cri" in lists else ())

    # envvar / volume-mounts; volume-mounts wins NVIDIA_VISIBLE_DEVICES when both are set
    envs: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    if not cdi_only:
        if "envvar" in lists:
            envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
        if "volume-mounts" in lists:
            envs["NVIDIA_VISIBLE_DEVICES"] = "/var/run/nvidia-container-devices"
            mounts = tuple(
                Mount(host_path="/dev/null", container_path=f"/var/run/nvidia-container-devices/{i}")
                for i in ids
            )
    assert got.envs == envs
    assert got.mounts == mounts

    # DeviceSpecs: only with passDeviceSpecs and a non-CDI strategy; control nodes first.
    if config.pass_device_specs and not cdi_only:
        # Two MIG devices of one GPU share its /dev/nvidia<minor>: each node is passed once.
        paths = list(dict.fromkeys(CONTROL + [p for r in picked for p in _expected_nodes(r)]))
        assert got.devices == tuple(
            DeviceSpec(container_path=p, host_path=posixpath.join(str(root), p.lstrip("/")), permissions="rw")
            for p in paths
        )
        for spec in got.devices:  # every node handed to the kubelet exists on the fake host
            assert Path(spec.host_path).exists(), spec.host_path
    else:
        assert got.devices == ()


def test_every_model_is_covered() -> None:
    assert {m for m, _ in CASES} == set(MODELS)
    assert ("mig-uniform", "single") in CASES and ("mig-mixed", "mixed") in CASES
