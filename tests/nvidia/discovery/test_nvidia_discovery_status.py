"""fail-on-init-error as a queryable state, and the sharing checks that need discovery."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devplug.errors import ConfigError
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._config._file import Sharing
from devplug_nvidia._gpu._nvml import NvmlError
from devplug_nvidia.discovery import InitStatus, MigStrategyError, check_sharing, discover, discover_or_idle
from devplug_nvidia.testing import MODELS, fake_nvml, write_root

MPS = Sharing.model_validate({"mps": {"resources": [{"name": "gpu", "replicas": 2}]}})
TIME_SLICING = Sharing.model_validate({"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}})


def _settings(root: Path, **kw: object) -> NvidiaSettings:
    return NvidiaSettings.model_validate({"fake_nvml": "mig-uniform", "driver_root": str(root), **kw})


def test_mps_on_single_strategy_mig_is_a_config_error(tmp_path: Path) -> None:
    write_root(MODELS["mig-uniform"], tmp_path)
    settings = _settings(tmp_path, mig_strategy="single", sharing=MPS, mps_root="/run/nvidia/mps")
    with pytest.raises(
        MigStrategyError, match=r"MPS sharing \(sharing.mps\) is not supported for MIG"
    ) as err:
        discover(settings)
    assert isinstance(err.value, ConfigError)  # the CLI's exit 2
    assert "nvidia.com/gpu" in str(err.value)


@pytest.mark.parametrize(("mig", "sharing"), [("none", MPS), ("single", TIME_SLICING), ("single", Sharing())])
def test_sharing_that_fits(tmp_path: Path, mig: str, sharing: Sharing) -> None:
    write_root(MODELS["mig-uniform"], tmp_path)
    settings = _settings(tmp_path, mig_strategy=mig, sharing=sharing, mps_root="/run/nvidia/mps")
    assert list(discover(settings)) == ["nvidia.com/gpu"]


def test_check_sharing_ignores_full_gpus() -> None:
    check_sharing({}, "mps")
    check_sharing({"nvidia.com/gpu": []}, "mps")


def test_idle_state_is_queryable(tmp_path: Path) -> None:
    status = InitStatus()
    assert (status.ready, status.reason) == (False, None)  # not started
    settings = _settings(tmp_path, fail_on_init_error=False)
    broken = fake_nvml("dgx-a100", init_error=9)  # driver not loaded
    with capture_logs() as logs:
        assert discover_or_idle(settings, status, module=broken) == {}
    assert status.ready is False
    assert status.reason and "driver" in status.reason.lower()
    assert [e["event"] for e in logs] == ["init_failed_idle"]
    assert logs[0]["reason"] == status.reason


def test_fail_on_init_error_raises_and_records(tmp_path: Path) -> None:
    status = InitStatus()
    with pytest.raises(NvmlError):
        discover_or_idle(_settings(tmp_path), status, module=fake_nvml("dgx-a100", init_error=9))
    assert status.ready is False and status.reason


def test_ready_after_discovery(tmp_path: Path) -> None:
    write_root(MODELS["mig-uniform"], tmp_path)
    status = InitStatus(reason="stale")
    resources = discover_or_idle(_settings(tmp_path, fail_on_init_error=False), status)
    assert resources and status.ready and status.reason is None
