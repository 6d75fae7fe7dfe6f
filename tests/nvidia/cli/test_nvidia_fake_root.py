"""The fake NVML model's host tree: laid out by ``--fake-nvml`` for one run, or kept with
``devplug-nvidia fake-root MODEL DIR``."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from devplug.errors import ConfigError
from devplug.testing import FakeKubelet
from devplug_nvidia._cli import _fake_root
from devplug_nvidia._cli._fake_root import FakeRoots, with_fake_root
from devplug_nvidia.config import load_nvidia_settings
from devplug_nvidia.labels import parse_args
from devplug_nvidia.testing import MODELS
from tests.support import logged_process

_NVIDIA_ENV = ("MIG_STRATEGY", "CONFIG_FILE", "FAIL_ON_INIT_ERROR", "NVIDIA_DRIVER_ROOT", "DEVPLUG_FAKE_NVML")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*_NVIDIA_ENV, "NVIDIA_DEV_ROOT", "DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary directory, empty at the start."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NVIDIA_ENV} | extra


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug_nvidia", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env or _env(),
    )


# -- fake-root MODEL DIR ---------------------------------------------------------------------------


def _null_node(path: Path) -> bool:
    """A character device with /dev/null's numbers: a real node as root (containerd's CDI
    injection does not follow links), else a link to /dev/null."""
    info, null = os.stat(path), os.stat("/dev/null")
    real_node = os.geteuid() != 0 or not path.is_symlink()
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == null.st_rdev and real_node


@pytest.mark.anyio
async def test_fake_root_writes_a_tree_a_later_run_uses(short_dir: Path) -> None:
    root, tmp = short_dir / "dgx", short_dir / "tmp"
    tmp.mkdir()
    written = _command("fake-root", "dgx-a100", str(root))
    assert written.returncode == 0, written.stderr
    assert (root / "sys/bus/pci/devices/0000:07:00.0/numa_node").read_text() == "3\n"
    assert (root / "proc/driver/nvidia-caps/mig-minors").is_file()
    assert _null_node(root / "dev/nvidia0")  # a character device to stat
    # It prints the commands that run on it.
    commands = [shlex.split(line) for line in written.stdout.splitlines() if line.startswith("  ")]
    flags = ["--fake-nvml", "dgx-a100", "--driver-root", str(root)]
    assert commands == [["devplug-nvidia", *flags], ["devplug-nvidia", "labels", *flags]]

    dp, log = short_dir / "dp", short_dir / "log"
    args = [*commands[0][1:], "--device-plugin-dir", str(dp), "--pass-device-specs"]
    async with (
        FakeKubelet(dp) as kubelet,
        logged_process("devplug_nvidia", args, log, env=_env(TMPDIR=str(tmp))),
    ):
        devices = await kubelet.wait_for_devices("nvidia.com/gpu", lambda ds: len(ds) == 8, timeout=20)
        assert [d.numa_nodes for d in devices] == [(3,), (3,), (1,), (1,), (7,), (7,), (5,), (5,)]
        allocation = await kubelet.allocate("nvidia.com/gpu", [devices[0].id])
        assert all(s.host_path.startswith(f"{root}/dev/") for s in allocation.devices)
        assert list(tmp.iterdir()) == []  # the given driver root is used as it is: no tree of its own
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e for e in events if e["level"] != "info"] == []
    assert "fake_nvml_root" not in {e["event"] for e in events}
    assert _null_node(root / "dev/nvidia0")  # and kept

    labelled = _command(*commands[1][1:], "--oneshot", "--no-timestamp", "-o", "", env=_env(TMPDIR=str(tmp)))
    assert labelled.returncode == 0, labelled.stderr
    assert "nvidia.com/gpu.machine=dgx-a100\n" in labelled.stdout
    assert "nvidia.com/gpu.mode=compute\n" in labelled.stdout
    assert '"level": "warning"' not in labelled.stderr
    assert list(tmp.iterdir()) == []


def test_fake_root_again_on_the_same_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _fake_root.main(["mig-mixed", str(tmp_path)]) == 0
    assert _fake_root.main(["mig-uniform", str(tmp_path)]) == 0  # the nodes of the first are replaced
    assert _null_node(tmp_path / "dev/nvidia1")
    assert "--fake-nvml mig-uniform --driver-root" in capsys.readouterr().out


def test_fake_root_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _fake_root.main(["dgx-a1", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'dgx-a1'" in err and "dgx-a100" in err
    assert _fake_root.main(["dgx-a100"]) == 2
    assert "DIR" in capsys.readouterr().err
    afile = tmp_path / "file"
    afile.write_text("")
    assert _fake_root.main(["dgx-a100", str(afile)]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(f"devplug-nvidia fake-root: cannot write the tree to {afile}") and err.count("\n") == 1
    )


def test_fake_root_help_lists_the_models() -> None:
    result = _command("fake-root", "--help")
    assert result.returncode == 0
    assert "usage: devplug-nvidia fake-root [-h] MODEL DIR" in result.stdout
    for name in MODELS:
        assert f"\n  {name} " in result.stdout


# -- the tree of one run ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "laid_out"),
    [
        ([], {}, True),
        (["--dev-root", "/somewhere"], {}, True),
        (["--driver-root", "/"], {}, False),
        (["--nvidia-driver-root", "/run/nvidia/driver"], {}, False),
        ([], {"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}, False),
    ],
)
def test_the_tree_replaces_only_a_driver_root_not_given(
    clean_env: pytest.MonkeyPatch, tmp: Path, args: list[str], env: dict[str, str], laid_out: bool
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    settings = load_nvidia_settings(["--fake-nvml", "pcie-a10", *args])
    with FakeRoots() as roots:
        on_tree = with_fake_root(settings, roots)
        if not laid_out:
            assert on_tree is settings and list(tmp.iterdir()) == []
            return
        root = roots.trees["pcie-a10"]
        assert root.parent.parent == tmp
        assert on_tree.driver_root == on_tree.driver_root_ctr_path == str(root)
        assert on_tree.dev_root == settings.dev_root  # a dev root given stays; unset, it follows
        assert (root / "sys/bus/pci/devices/0000:b1:00.0/numa_node").read_text() == "1\n"
        assert with_fake_root(settings, roots) == on_tree  # one tree per model (SIGHUP re-reads)
    assert list(tmp.iterdir()) == []


def test_driver_root_from_the_config_file_is_used(clean_env: pytest.MonkeyPatch, tmp: Path) -> None:
    config = tmp.parent / "config.yaml"
    config.write_text("version: v1\nflags:\n  nvidiaDriverRoot: /run/nvidia/driver\n")
    settings = load_nvidia_settings(["--fake-nvml", "pcie-a10", "--config-file", str(config)])
    with FakeRoots() as roots:
        assert with_fake_root(settings, roots).driver_root == "/run/nvidia/driver"
    assert list(tmp.iterdir()) == []


def test_no_tree_without_a_model(clean_env: pytest.MonkeyPatch, tmp: Path) -> None:
    with FakeRoots() as roots:
        settings = load_nvidia_settings([])
        assert with_fake_root(settings, roots) is settings
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("driver_root", [[], ["--driver-root", "/run/nvidia/driver"]], ids=["tree", "given"])
def test_an_unknown_model_is_refused(
    clean_env: pytest.MonkeyPatch, tmp: Path, driver_root: list[str]
) -> None:
    settings = load_nvidia_settings(["--fake-nvml", "no-such-model", *driver_root])
    with FakeRoots() as roots, pytest.raises(ConfigError, match=r"^invalid setting --fake-nvml: no model"):
        with_fake_root(settings, roots)
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("argv", [["--fake-nvml", "NOSUCH"], ["--fake-nvml", "NOSUCH", "--api", "dra"]])
def test_an_unknown_model_exits_2_with_one_line(clean_env: pytest.MonkeyPatch, argv: list[str]) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "devplug-nvidia"), *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        "devplug-nvidia: invalid setting --fake-nvml: no model 'NOSUCH'; known: dgx-a100"
    )
    assert result.stderr.count("\n") == 1


def _start_then_sigterm(seen: list[object]) -> None:
    with FakeRoots() as roots:
        assert roots.root("dgx-a100") is not None
        seen.append(signal.getsignal(signal.SIGTERM))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives here


def test_sigterm_before_serving_removes_the_tree(tmp: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []
    with pytest.raises(SystemExit) as exited:
        _start_then_sigterm(seen)
    assert seen and seen[0] is not before  # taken over while a tree exists
    assert exited.value.code == 128 + signal.SIGTERM
    assert list(tmp.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_labels_machine_type_file_follows_a_fake_driver_root(tmp_path: Path) -> None:
    settings = parse_args(["--fake-nvml", "pcie-a10", "--driver-root", str(tmp_path)], environ={})
    assert settings.machine_type_file == f"{tmp_path}/sys/class/dmi/id/product_name"
    given = ["--fake-nvml", "pcie-a10", "--driver-root", str(tmp_path), "--machine-type-file", "/x"]
    assert parse_args(given, environ={}).machine_type_file == "/x"
    assert parse_args(["--driver-root", str(tmp_path)], environ={}).machine_type_file == (
        "/sys/class/dmi/id/product_name"
    )


def test_an_os_error_at_start_is_a_sentence(clean_env: pytest.MonkeyPatch, tmp: Path) -> None:
    """Not Python's "[Errno 2] No such file or directory: '...'"."""
    cdi_dir = tmp / "file" / "cdi"
    (tmp / "file").write_text("not a directory")
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "devplug-nvidia"),
            *("--fake-nvml", "pcie-a10", "--device-list-strategy", "cdi-cri", "--cdi-dir", str(cdi_dir)),
            *("--device-plugin-dir", str(tmp / "dp")),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "[Errno" not in last and "'" not in last, last
    spec = cdi_dir / "k8s.device-plugin.nvidia.com-gpu.json"
    assert (
        last == f"devplug-nvidia: cannot write the CDI spec {spec}: a part of the path is not a directory"
    ), last
