"""SIGHUP under DRA: the configuration read again and applied as under the device-plugin API."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from devplug.testing import FakeKubeAPI
from devplug.testing._process import signal_child
from tests.dra.dra_kit import NODE
from tests.metrics.probing import plugin, wait_for_event

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
