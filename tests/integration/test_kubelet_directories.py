"""The kubelet's directories are the kubelet's: devplug never creates them, it waits for them and
says which one is missing (inotify on the nearest existing ancestor sees them appear at once)."""

from __future__ import annotations

import json
import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from devplug import ConfigError, Runner
from devplug.dra import DraDriver
from devplug.testing import FakeKubeAPI, FakeKubelet
from tests.support import Widgets, logged_process, never_within, serving, settings_for, wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/widget"
DRIVER = "widget.example.com"


@pytest.fixture(autouse=True)
def quick_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeat the missing-directory warning every 0.05 s, then 0.1 s (10 s and 300 s in service)."""
    monkeypatch.setattr("devplug._runtime.watch.MISSING_WARNING_BACKOFF", (0.05, 0.1))


def missing_warnings(logs: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "kubelet_directory_missing" and e["path"] == str(path)]


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


async def test_a_missing_device_plugin_dir_is_waited_for_not_created(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    dp = settings.device_plugin_dir
    with capture_logs() as logs:
        async with serving(Widgets(), settings) as runner:
            await wait_until(lambda: len(missing_warnings(logs, dp)) >= 2)
            assert not dp.exists()
            assert f"{dp} does not exist (the kubelet creates it)" in runner.readiness()[1]
            first, second = missing_warnings(logs, dp)[:2]
            assert first["log_level"] == "warning"
            assert "kubelet creates" in first["note"]
            assert first["next_in"] == 0.05 and second["next_in"] == 0.1  # backing off
            async with FakeKubelet(dp) as kubelet:
                reg = await kubelet.wait_for_registration(RESOURCE)
                assert (dp / reg.endpoint).is_socket()
                await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)
    assert [e["path"] for e in events(logs, "kubelet_directory_found")] == [str(dp)]
    assert not events(logs, "resource_failed")


async def test_missing_parents_are_watched_level_by_level(short_dir: Path) -> None:
    top = short_dir / "a"
    dp = top / "b" / "device-plugins"
    settings = settings_for(short_dir, device_plugin_dir=dp)
    with capture_logs() as logs:
        async with serving(Widgets(), settings):
            await wait_until(lambda: len(missing_warnings(logs, dp)) >= 1)
            top.mkdir()  # the watch moves down to a/, and nothing is made below it
            (top / "b").mkdir()
            await wait_until(lambda: len(missing_warnings(logs, dp)) >= 3)
            assert not dp.exists()
            async with FakeKubelet(dp) as kubelet:
                await kubelet.wait_for_registration(RESOURCE)
            count = len(missing_warnings(logs, dp))
            await never_within(  # three warning intervals: none once it is there
                lambda: len(missing_warnings(logs, dp)) != count, 0.3, what="a warning once it is there"
            )


async def test_a_deleted_directory_is_waited_for_again(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    dp = settings.device_plugin_dir
    with capture_logs() as logs:
        async with FakeKubelet(dp) as kubelet, serving(Widgets(), settings) as runner:
            await kubelet.wait_for_registration(RESOURCE)
            await kubelet.stop()
            shutil.rmtree(dp)  # the kubelet being reinstalled
            await wait_until(lambda: len(missing_warnings(logs, dp)) >= 2)
            assert [e["path"] for e in events(logs, "watched_directory_gone")] == [str(dp)]
            assert not dp.exists()
            await kubelet.start()
            await kubelet.wait_for_registration(RESOURCE, count=2)
            await wait_until(lambda: runner.resources[RESOURCE].registered)
    assert not events(logs, "resource_failed")


async def test_watcher_mode_waits_for_plugins_registry(short_dir: Path) -> None:
    settings = settings_for(short_dir, registration="watcher")
    registry = settings.plugins_registry_dir
    with capture_logs() as logs:
        async with serving(Widgets(), settings):
            await wait_until(lambda: len(missing_warnings(logs, registry)) >= 2)
            assert not registry.exists()
            kubelet = FakeKubelet(settings.device_plugin_dir, plugins_registry_dir=registry)
            async with kubelet:
                reg = await kubelet.wait_for_registration(RESOURCE)
                assert reg.via == "watcher"
                assert (registry / reg.endpoint).is_socket()


async def test_a_file_in_the_directorys_place_is_refused(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    settings.device_plugin_dir.write_text("")
    with pytest.raises(ConfigError, match="device-plugins exists and is not a directory"):
        await Runner(Widgets(), settings).run(handle_signals=False)


async def test_a_world_writable_directory_that_appears_later_is_refused(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    dp = settings.device_plugin_dir
    runner = Runner(Widgets(), settings)
    failure: list[BaseException] = []

    async def run() -> None:
        try:
            await runner.run(handle_signals=False)
        except BaseException as exc:  # what the command sees: one ConfigError, not a group
            failure.append(exc)

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await runner.wait_started()
            await wait_until(lambda: len(missing_warnings(logs, dp)) >= 1)
            dp.mkdir()
            dp.chmod(0o777)  # chmod-ed before the watch is placed on it: judged when found
            await wait_until(lambda: failure, what="the runner to end by itself")
    (error,) = failure
    assert type(error) is ConfigError
    assert str(error).startswith(f"refusing to start: {dp} is writable by every user (mode 0777)")
    assert list(dp.iterdir()) == []  # nothing was served in it


async def test_a_world_writable_directory_that_appears_later_is_warned_about(short_dir: Path) -> None:
    settings = settings_for(short_dir, insecure_dir="warn")
    dp = settings.device_plugin_dir
    with capture_logs() as logs:
        async with serving(Widgets(), settings):
            await wait_until(lambda: len(missing_warnings(logs, dp)) >= 1)
            tmp = short_dir / "incoming"
            tmp.mkdir()
            tmp.chmod(0o777)
            tmp.rename(dp)  # appears world-writable at once
            await wait_until(lambda: bool(events(logs, "insecure_directory")))
            (warning,) = events(logs, "insecure_directory")
            assert str(dp) in warning["problem"]
            async with FakeKubelet(dp) as kubelet:
                await kubelet.wait_for_registration(RESOURCE)


async def test_dra_driver_waits_for_plugins_registry(short_dir: Path) -> None:
    from devplug import Settings

    root = short_dir / "kubelet"
    root.mkdir()
    async with FakeKubeAPI() as api:
        api.add_node("node-1")
        settings = Settings(
            api="dra",
            kubelet_root=root,
            node_name="node-1",
            kubeconfig=api.write_kubeconfig(short_dir / "kubeconfig"),
            cdi_dir=short_dir / "cdi",
            driver_name=DRIVER,
            shutdown_grace=0.2,
        )
        registry = settings.plugins_registry_dir
        driver = DraDriver([Widgets()], settings)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(driver.run, handle_signals=False))
                await wait_until(lambda: len(missing_warnings(logs, registry)) >= 2)
                assert not registry.exists()
                assert driver.state_dir.is_dir()  # the driver's own directory is made
                assert f"{registry} does not exist (the kubelet creates it)" in driver.readiness()[1]
                kubelet = FakeKubelet(
                    root / "device-plugins", plugins_registry_dir=registry, dra=True, kube_api=api
                )
                async with kubelet:
                    reg = await kubelet.wait_for_dra_registration(DRIVER)
                    assert reg.accepted
                    await kubelet.wait_for_usable(DRIVER)
                tg.cancel_scope.cancel()
        assert not events(logs, "serve_failed")


async def test_a_mistyped_directory_shows_in_the_log_of_the_process(short_dir: Path) -> None:
    typo = short_dir / "device-plugnis"
    log = short_dir / "fake.log"

    def warned() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        return [e for e in lines if e.get("event") == "kubelet_directory_missing"]

    async with logged_process("devplug_fake", ["--device-plugin-dir", str(typo)], log):
        # 30 s: a process that starts on two busy cores.
        await wait_until(warned, timeout=30, interval=0.05)
        (warning,) = warned()[:1]
        assert warning["path"] == str(typo)
        assert warning["level"] == "warning"
        assert not typo.exists()
    assert not typo.exists()
    assert "Traceback" not in log.read_text()
    assert os.listdir(short_dir) == ["fake.log"]
