"""The NVML layer: error translation, library loading, and real-NVML checks where a GPU exists."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devplug.errors import DevplugError
from devplug_nvidia._gpu._nvml import LIBRARY_NAME, Nvml, NvmlError, find_library, translate_error
from devplug_nvidia.testing import fake_nvml, write_root


@pytest.mark.parametrize(
    ("code", "phrases"),
    [
        (12, ["libnvidia-ml.so.1", "driver root", "runtimeClassName: nvidia"]),
        (9, ["kernel driver is not loaded", "lsmod"]),
        (4, ["permission", "/dev/nvidiactl"]),
        (15, ["fallen off the bus", "Xid 79"]),
        (13, ["driver is too old"]),
        (18, ["version"]),
        (1, ["nvmlInit"]),
    ],
)
def test_translation_says_what_to_check(code: int, phrases: list[str]) -> None:
    fake = fake_nvml("pcie-a10")
    error = translate_error(fake.NVMLError(code), "nvmlInit")
    assert isinstance(error, DevplugError)
    assert error.code == code
    assert error.call == "nvmlInit"
    for phrase in phrases:
        assert phrase in str(error)


def test_translation_of_real_pynvml_errors() -> None:
    pynvml = pytest.importorskip("pynvml")
    error = translate_error(pynvml.NVMLError_LibraryNotFound(), "nvmlInit")
    assert error.code == 12
    assert "NVML Shared Library Not Found" in str(error)


def test_open_init_failure_is_translated() -> None:
    with pytest.raises(NvmlError, match="runtimeClassName") as info:
        Nvml.open(fake_nvml("dgx-a100", init_error=12))
    assert info.value.code == 12


def test_call_translates_and_close_is_idempotent() -> None:
    fake = fake_nvml("dgx-a100")
    nvml = Nvml.open(fake)
    fake.fail("nvmlDeviceGetCount", 4)
    with pytest.raises(NvmlError) as info:
        nvml.call("nvmlDeviceGetCount")
    assert (info.value.code, info.value.call) == (4, "nvmlDeviceGetCount")
    assert nvml.call("nvmlDeviceGetCount") == 8
    with pytest.raises(NvmlError, match="upgrade nvidia-ml-py"):
        nvml.call("nvmlDeviceGetNoSuchThing")
    assert nvml.const("NVML_TOPOLOGY_SYSTEM") == 50
    nvml.close()
    nvml.close()
    assert fake.calls.count("nvmlShutdown") == 1


def test_library_loaded_from_driver_root(tmp_path: Path) -> None:
    fake = fake_nvml("dgx-a100")
    write_root(fake.model, tmp_path)
    with Nvml.open(fake, driver_root=tmp_path):
        pass
    assert fake.loaded_library == str(tmp_path / "usr/lib/x86_64-linux-gnu" / LIBRARY_NAME)
    assert fake.nvmlLib is not None


def test_default_root_leaves_loading_to_pynvml() -> None:
    fake = fake_nvml("dgx-a100")
    with Nvml.open(fake, driver_root="/"):
        pass
    assert fake.loaded_library is None


def test_missing_library_under_driver_root(tmp_path: Path) -> None:
    with pytest.raises(NvmlError, match="not found under the driver root") as info:
        find_library(tmp_path)
    assert info.value.code == 12
    assert "runtimeClassName: nvidia" in str(info.value)


def test_unloadable_library_is_library_not_found(tmp_path: Path) -> None:
    # The real loader (ctypes.CDLL) on a file that is not a library.
    pynvml: Any = pytest.importorskip("pynvml")
    lib = tmp_path / "usr/lib64" / LIBRARY_NAME
    lib.parent.mkdir(parents=True)
    lib.write_text("not a library")
    saved = pynvml.nvmlLib
    try:
        with pytest.raises(NvmlError, match="could not be loaded") as info:
            Nvml.open(pynvml, driver_root=tmp_path)
    finally:
        pynvml.nvmlLib = saved
    assert info.value.code == 12


def _nvidia_smi_works() -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU: nvidia-smi not found")
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0 or "GPU" not in result.stdout:
        pytest.skip(f"no NVIDIA GPU: nvidia-smi -L failed ({result.returncode}): {result.stderr.strip()}")


@pytest.mark.gpu
def test_real_nvml_opens_and_counts() -> None:
    _nvidia_smi_works()
    with Nvml.open() as nvml:
        assert nvml.call("nvmlDeviceGetCount") >= 1
        assert nvml.call("nvmlSystemGetDriverVersion")
