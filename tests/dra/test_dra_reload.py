"""SIGHUP under DRA: the configuration read again and applied as under the device-plugin API."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from devplug.testing import FakeKubeAPI
from devplug.testing._process import signal_child
from tests.dra.dra_kit import NODE
from tests.metrics.probing import env, plugin, wait_for_event
from tests.support import logged_process

pytestmark = pytest.mark.anyio

DRIVER = "fake.example.com"
RESOURCE = "example.com/fake"


def write_config(path: Path, count: int, **extra: object) -> None:
    path.write_text(yaml.safe_dump({"resources": [{"name": RESOURCE, "count": count}], **extra}))


async def test_sighup_replaces_the_changed_plugin_and_its_slices_follow(short_dir: Path) -> None:
    config, log = short_dir / "fake.yaml", short_dir / "driver.log"
    write_config(config, 2)
    (short_dir / "k" / "plugins_registry").mkdir(parents=True)
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(short_dir / "kc")
        options = [
            "--api", "dra", "--driver-name", DRIVER, "--node-name", NODE, "--kubeconfig", str(kubeconfig),
            "--kubelet-root", str(short_dir / "k"), "--cdi-dir", str(short_dir / "cdi"),
            "--config", str(config),
        ]  # fmt: skip
        async with plugin(log, "devplug_fake", *options) as process:
            await api.wait_for_slices(node=NODE, driver=DRIVER, count=1, timeout=30)

            def published() -> int:
                slices = api.slices(node=NODE, driver=DRIVER)
                return sum(len(s["spec"].get("devices", [])) for s in slices)

            assert published() == 2

            # Unchanged: nothing restarts.
            signal_child(process, signal.SIGHUP)
            done = (await wait_for_event(log, "reloaded"))[-1]
            assert (done["unchanged"], done["restarted"]) == ([RESOURCE], [])

            # Four devices now: the plugin is replaced and the slices list four.
            write_config(config, 4)
            signal_child(process, signal.SIGHUP)
            done = (await wait_for_event(log, "reloaded", 2))[-1]
            assert (done["unchanged"], done["restarted"]) == ([], [RESOURCE])
            await api.wait_for(lambda: published() == 4, timeout=10)

            # An invalid file, then another set of resources: refused, the driver keeps serving.
            config.write_text(f"resources: [{{name: {RESOURCE}, count: -1}}]\n")
            signal_child(process, signal.SIGHUP)
            failed = (await wait_for_event(log, "reload_failed"))[-1]
            assert "count" in failed["error"]
            config.write_text(yaml.safe_dump({"resources": [{"name": "example.com/other", "count": 1}]}))
            signal_child(process, signal.SIGHUP)
            failed = (await wait_for_event(log, "reload_failed", 2))[-1]
            assert "cannot change without a restart" in failed["error"]
            assert published() == 4


@pytest.mark.parametrize("api", ["device-plugin", "dra"])
async def test_sighup_with_unchanged_options_restarts_nothing(short_dir: Path, api: str) -> None:
    """``devplug.run(factory)`` makes a new plugin object each time it is called: a reload whose options
    did not change keeps that object, the first SIGHUP too, under either API."""
    (short_dir / "widgets_main.py").write_text(
        "import devplug\nfrom tests.support import Widgets\ndevplug.run(lambda settings: Widgets())\n"
    )
    log = short_dir / "run.log"
    (short_dir / "k" / "plugins_registry").mkdir(parents=True)
    async with FakeKubeAPI() as kube_api:
        kube_api.add_node(NODE)
        kubeconfig = kube_api.write_kubeconfig(short_dir / "kc")
        options = [
            "--api", api, "--kubelet-root", str(short_dir / "k"), "--node-name", NODE,
            "--device-plugin-dir", str(short_dir / "k" / "device-plugins"),
            "--kubeconfig", str(kubeconfig), "--cdi-dir", str(short_dir / "cdi"),
        ]  # fmt: skip
        path = {"PYTHONPATH": f"{short_dir}{os.pathsep}{env()['PYTHONPATH']}"}
        async with logged_process("widgets_main", options, log, env=env() | path) as process:
            await wait_for_event(log, "started")
            for count in (1, 2):
                signal_child(process, signal.SIGHUP)
                done = (await wait_for_event(log, "reloaded", count))[-1]
                assert (done["unchanged"], done["restarted"]) == (["example.com/widget"], [])
