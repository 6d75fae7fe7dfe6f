"""``--additional-xids-to-ignore`` (``ADDITIONAL_XIDS_TO_IGNORE``) of NVIDIA's DRA driver, and the
health monitor of a NvidiaDraPlugin served as ``devplug run --api dra`` serves it
(:func:`devplug.dra.serve`, no monitor started by hand): XIDs injected through FakeNvml become
device taints in the FakeKubeAPI's ResourceSlice."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from devplug import ConfigError
from devplug.dra import serve
from devplug.testing import FakeKubeAPI
from devplug_nvidia._dra._health import DraHealthMonitor, MonitorTask, additional_ignored
from devplug_nvidia.config import load_nvidia_settings
from devplug_nvidia.dra import NvidiaDraPlugin
from devplug_nvidia.testing import MODELS, FakeNvml, write_root
from tests.nvidia.nvidia_dra_kit import DRIVER, NODE, dra_cluster, published_taints, wait_taints
from tests.support import never_within, wait_until

pytestmark = pytest.mark.anyio

XID = f"{DRIVER}/xid"
ENV = "ADDITIONAL_XIDS_TO_IGNORE"


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV, "DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS", "FEATURE_GATES", "CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)


# -- the flag and the environment variable ---------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "ignored"),
    [
        ([], None, set()),
        (["--additional-xids-to-ignore", "94"], None, {94}),
        (["--additional-xids-to-ignore= 94 , 95,,"], None, {94, 95}),
        ([], "63,64", {63, 64}),
        ([], " 007 ", {7}),
        (["--additional-xids-to-ignore", "94"], "63", {94}),  # the flag beats the variable
        (["--additional-xids-to-ignore", ""], "63", set()),
    ],
)
def test_the_flag_and_the_variable_name_xids(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: str | None, ignored: set[int]
) -> None:
    if env is not None:
        monkeypatch.setenv(ENV, env)
    settings = load_nvidia_settings(["--api", "dra", *argv])
    assert additional_ignored(settings) == ignored


@pytest.mark.parametrize(
    ("value", "item"),
    [("94,abc", "abc"), ("-3", "-3"), ("0x30", "0x30"), ("94;95", "94;95"), ("94 95", "94 95"), ("٣", "٣")],
)
def test_an_entry_that_is_not_an_xid_is_refused(value: str, item: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_nvidia_settings(["--additional-xids-to-ignore", value])
    assert str(info.value) == (
        f'invalid value "{value}" for flag --additional-xids-to-ignore: '
        f'"{item}" is not an XID (an unsigned integer)'
    )


@pytest.mark.parametrize("command", [["devplug_nvidia", "--api", "dra"], ["devplug", "run", "--api", "dra"]])
def test_a_bad_variable_exits_2_with_one_line(command: list[str]) -> None:
    if command[0] == "devplug":
        command = [*command, "devplug_nvidia.dra:NvidiaDraPlugin"]
    result = subprocess.run(
        [sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != ENV} | {ENV: "43,oops"},
    )
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.rstrip().endswith(
        'invalid value "43,oops" for flag --additional-xids-to-ignore: '
        '"oops" is not an XID (an unsigned integer)'
    )


def _plugin(root: Path, *argv: str) -> NvidiaDraPlugin:
    """The plugin ``devplug run`` builds from ``argv`` on the fake pcie-a10 machine."""
    if not root.exists():
        write_root(MODELS["pcie-a10"], root)
    argv = ("--api", "dra", "--fake-nvml", "pcie-a10", "--driver-root", str(root), *argv)
    return NvidiaDraPlugin.from_settings(load_nvidia_settings(list(argv)))


@pytest.mark.parametrize(
    ("value", "env", "verdicts"),
    [
        ("", {}, {13: "ignored", 94: "recoverable", 79: "fatal"}),
        ("94,79", {}, {13: "ignored", 94: "ignored", 79: "ignored", 63: "recoverable"}),
        # DP_ENABLE_HEALTHCHECKS still counts an XID whatever else ignores it, as for 13.
        ("94", {"DP_ENABLE_HEALTHCHECKS": "94,13"}, {94: "recoverable", 13: "recoverable"}),
        ("94", {"DP_DISABLE_HEALTHCHECKS": "63"}, {94: "ignored", 63: "ignored", 64: "fatal"}),
    ],
)
def test_the_monitor_ignores_the_listed_xids_as_the_built_in_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str, env: dict[str, str], verdicts: dict[int, str]
) -> None:
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    monitor = _plugin(tmp_path / "root", "--additional-xids-to-ignore", value).health
    assert monitor is not None
    assert {xid: monitor.xids.verdict(xid) for xid in verdicts} == verdicts


def test_help_shows_the_option() -> None:
    from devplug_nvidia._cli._help import help_text

    text = " ".join(help_text("devplug-nvidia").split())
    assert "--additional-xids-to-ignore XID[,XID] For --api dra:" in text
    assert "(ADDITIONAL_XIDS_TO_IGNORE)" in text


# -- served as devplug run serves it ------------------------------------------------------------------


class Served:
    def __init__(self, api: FakeKubeAPI, plugin: NvidiaDraPlugin) -> None:
        self.api = api
        self.plugin = plugin
        assert plugin.nvml_source is not None
        self.fake: FakeNvml = plugin.nvml_source.module

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        return published_taints(self.api)

    async def wait_taints(self, predicate: Any) -> dict[str, list[dict[str, Any]]]:
        return await wait_taints(self.api, predicate)

    def open_event_sets(self) -> int:
        return sum(1 for s in self.fake._sets() if not s.freed)


@asynccontextmanager
async def served(short_dir: Path, *argv: str) -> AsyncIterator[Served]:
    """``devplug run --api dra devplug_nvidia.dra:NvidiaDraPlugin`` on the fake NVML, in this
    process: the settings read from ``argv``, the plugin from ``from_settings``, served by
    :func:`devplug.dra.serve` (what ``devplug._main.run`` does for ``--api dra``)."""
    root = write_root(MODELS["pcie-a10"], short_dir / "root")
    async with dra_cluster(short_dir) as (api, _kubelet, kubelet_root):
        api.add_node(NODE)
        settings = load_nvidia_settings(
            [
                "--api", "dra", "--driver-name", DRIVER, "--fake-nvml", "pcie-a10",
                "--driver-root", str(root), "--node-name", NODE, "--kubelet-root", str(kubelet_root),
                "--kubeconfig", str(api.write_kubeconfig(short_dir / "kc")),
                "--cdi-dir", str(short_dir / "cdi"), "--shutdown-grace", "0.2", *argv,
            ]
        )  # fmt: skip
        plugin = NvidiaDraPlugin.from_settings(settings)
        assert plugin.health is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(serve, plugin, settings, handle_signals=False))
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=10)
            with anyio.fail_after(10):
                await plugin.health.wait_started()  # started by the plugin's own device stream
            yield Served(api, plugin)
            tg.cancel_scope.cancel()


async def test_a_listed_xid_is_an_informational_taint_an_unlisted_one_noschedule(short_dir: Path) -> None:
    async with served(short_dir, "--additional-xids-to-ignore", "94,95") as s:
        assert s.taints() == {f"gpu-{i}": [] for i in range(4)}
        assert s.open_event_sets() == 1
        s.fake.push_xid(0, 94)
        taints = await s.wait_taints(lambda t: t["gpu-0"])
        assert taints["gpu-0"] == [{"key": XID, "value": "94", "effect": "None"}]
        s.fake.push_xid(1, 63)
        taints = await s.wait_taints(lambda t: t["gpu-1"])
        assert taints["gpu-1"] == [{"key": XID, "value": "63", "effect": "NoSchedule"}]
        assert taints["gpu-0"] == [{"key": XID, "value": "94", "effect": "None"}]
        assert not taints["gpu-2"] and not taints["gpu-3"]
        fake = s.fake
    # The monitor stopped with the stream; its last wait's thread frees the set when it returns.
    await wait_until(lambda: all(x.freed for x in fake._sets()), timeout=10, what="the event set freed")


async def test_without_the_option_the_same_xid_is_noschedule(short_dir: Path) -> None:
    async with served(short_dir) as s:
        s.fake.push_xid(0, 94)
        taints = await s.wait_taints(lambda t: t["gpu-0"])
        assert taints["gpu-0"] == [{"key": XID, "value": "94", "effect": "NoSchedule"}]


# -- one monitor run at a time ---------------------------------------------------------------------


async def test_a_monitor_is_not_run_twice(short_dir: Path) -> None:
    """A second run of a monitor that watches already (the device stream's here; a server's of
    its own in tests/nvidia/dra/test_nvidia_dra_health.py) opens no second event set, and its end
    leaves the first one watching."""
    async with served(short_dir) as s:
        health = s.plugin.health
        assert health is not None
        assert s.open_event_sets() == 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(health.run)
            await never_within(lambda: s.open_event_sets() != 1, 0.2, what="a second event set")
            tg.cancel_scope.cancel()
        s.fake.push_xid(2, 79)
        taints = await s.wait_taints(lambda t: t["gpu-2"])
        assert taints["gpu-2"] == [{"key": XID, "value": "79", "effect": "NoSchedule"}]


class _Broken(DraHealthMonitor):
    async def _watch(self, session: Any) -> None:
        raise RuntimeError("a bug in the event loop")


async def test_a_monitor_that_dies_fails_the_device_stream(tmp_path: Path) -> None:
    """The framework logs a failed stream and iterates it again (which starts the monitor
    again), instead of serving health that no longer changes."""
    plugin = _plugin(tmp_path / "root")
    assert plugin.nvml_source is not None
    broken = _Broken(plugin.records, driver=DRIVER, module=plugin.nvml_source.module, retry_interval=0.1)
    task = MonitorTask(broken)
    with pytest.raises(RuntimeError, match="a bug in the event loop"):
        await task.wait_changed(broken.version)
    await task.stop()
    plugin.health = broken
    stream = plugin.watch_devices()
    first = await anext(stream)
    assert [d.name for d in first] == [f"gpu-{i}" for i in range(4)]
    with anyio.fail_after(10), pytest.raises(RuntimeError, match="a bug in the event loop"):
        await anext(stream)
    assert all(s.freed for s in plugin.nvml_source.module._sets())
