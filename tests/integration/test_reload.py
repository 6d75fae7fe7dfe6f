"""SIGHUP: the config file read again; only the resources whose settings changed restart."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

import devplug
from devplug import ConfigError, Settings
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.metrics.probing import events, plugin, wait_for_event
from tests.support import Widgets, settings_for, wait_until

pytestmark = pytest.mark.anyio
A, B = "example.com/a", "example.com/b"


def write_config(path: Path, b_count: int | str, **extra: Any) -> None:
    resources = [{"name": A, "count": 2}, {"name": B, "count": b_count}]
    path.write_text(yaml.safe_dump({"resources": resources, **extra}))


async def test_sighup_restarts_only_changed_resources(short_dir: Path) -> None:
    dp, config, log = short_dir / "dp", short_dir / "fake.yaml", short_dir / "log"
    write_config(config, 2)
    async with (
        FakeKubelet(dp) as kubelet,
        plugin(log, "devplug_fake", "--device-plugin-dir", str(dp), "--config", str(config)) as process,
    ):
        reg_a = await kubelet.wait_for_registration(A, timeout=15)
        await kubelet.wait_for_registration(B, timeout=15)
        await kubelet.wait_for_devices(B, lambda ds: len(ds) == 2)

        def registrations(name: str) -> int:
            return sum(r.resource == name and r.accepted for r in kubelet.registrations)

        # Unchanged: nothing restarts.
        signal_child(process, signal.SIGHUP)
        done = (await wait_for_event(log, "reloaded"))[-1]
        assert (done["unchanged"], done["restarted"], done["settings_changed"]) == ([A, B], [], [])

        # B changed: B registers again with three devices; A keeps its server and stream.
        write_config(config, 3)
        signal_child(process, signal.SIGHUP)
        done = (await wait_for_event(log, "reloaded", 2))[-1]
        assert (done["unchanged"], done["restarted"]) == ([A], [B])
        await kubelet.wait_for_registration(B, count=2)
        await kubelet.wait_for_devices(B, lambda ds: len(ds) == 3)

        # Invalid: logged, the running configuration is kept.
        write_config(config, "many")
        signal_child(process, signal.SIGHUP)
        failed = (await wait_for_event(log, "reload_failed"))[-1]
        assert failed["error"].startswith("invalid setting resources.1.count")
        assert failed["keeping"] == "the current configuration"

        # A setting bound at start: refused the same way.
        write_config(config, 3, registration="watcher")
        signal_child(process, signal.SIGHUP)
        failed = (await wait_for_event(log, "reload_failed", 2))[-1]
        assert failed["error"] == "registration cannot change without a restart"

        assert (registrations(A), registrations(B)) == (1, 2)
        assert Path(kubelet.resource(A).endpoint).name == reg_a.endpoint
        assert len(kubelet.resource(B).devices) == 3
        assert process.returncode is None
    reasons = [(e["resource"], e["reason"]) for e in events(log, "registered") if "reason" in e]
    assert sorted(reasons) == [(A, "start"), (B, "replaced"), (B, "start")]


async def test_runner_reload_in_process(short_dir: Path) -> None:
    """Runner.reload: same objects keep serving, new settings restart every resource."""
    one, two = Widgets("example.com/one"), Widgets("example.com/two")
    settings = settings_for(short_dir)
    answers: list[Any] = []

    def reload() -> tuple[Settings, list[devplug.DevicePlugin]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async with FakeKubelet(settings.device_plugin_dir) as kubelet:
        runner = devplug.Runner([one, two], settings, reload=reload)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: runner.run(handle_signals=False))
            await runner.wait_started()
            await kubelet.wait_for_registration("example.com/two")
            # Dropped, replaced, kept.
            three = Widgets("example.com/three")
            answers.append((settings, [one, three]))
            assert await runner.reload()
            assert sorted(runner.resources) == ["example.com/one", "example.com/three"]
            await kubelet.wait_for_registration("example.com/three")
            # A resource-wide setting: all restart, with the reason "replaced".
            answers.append((settings.model_copy(update={"host_path_check": "off"}), [one, three]))
            assert await runner.reload()
            await kubelet.wait_for_registration("example.com/one", count=2)
            await wait_until(lambda: len(runner.resources["example.com/one"].registrations) == 2)
            assert [r for _, r in runner.resources["example.com/one"].registrations] == ["start", "replaced"]
            # Errors keep what runs.
            answers.append(ConfigError("invalid setting x: no"))
            assert not await runner.reload()
            assert runner.reloads == {"applied": 2, "failed": 1}
            assert [e["event"] for e in runner.history][-1] == "reload_failed"
            assert json.dumps(runner.debug_state())  # JSON-serialisable
            tg.cancel_scope.cancel()


def test_reload_with_a_plugin_source_is_refused() -> None:
    class Source:
        async def watch_plugins(self) -> Any:
            yield []

    with pytest.raises(ValueError, match="PluginSource"):
        devplug.Runner(Source(), reload=lambda: (Settings(), []))
