"""The counters behind the metrics, the public hooks, and readiness in process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import devplug.metrics
from devplug import Device, Health
from devplug._device_plugin.metrics import DevicePluginCollector
from devplug._device_plugin.telemetry import ResourceCounters
from devplug._runtime.exposition import registry_for, render
from devplug._runtime.state import DeviceState
from devplug._runtime.telemetry import DURATION_BUCKETS, RpcStats
from devplug.metrics import event_counter, note_health_reason
from devplug.testing import FakeKubelet
from tests.nvidia.nvidia_health_kit import monitoring
from tests.support import Widgets, serving, settings_for, wait_until


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [(0.0, "0.0001"), (0.0001, "0.0001"), (0.00011, "0.00025"), (10.0, "10.0"), (10.5, "+Inf")],
)
def test_rpc_histogram_bucket_edges(seconds: float, bucket: str) -> None:
    stats = RpcStats()
    stats.observe(seconds)
    cumulative = dict(stats.cumulative())
    assert list(cumulative)[-1] == "+Inf"
    assert len(cumulative) == len(DURATION_BUCKETS) + 1
    first = next(le for le, count in stats.cumulative() if count == 1)
    assert first == bucket
    assert cumulative["+Inf"] == stats.requests == 1


def test_health_transitions_with_and_without_a_reason() -> None:
    state = DeviceState()
    counters = ResourceCounters("example.com/r")

    def publish(*health: Health) -> None:
        before = state.current
        state.publish([Device(id=f"d{i}", health=h) for i, h in enumerate(health)])
        counters.count_transitions(before, state.current)

    publish(Health.UNHEALTHY, Health.HEALTHY)  # the first list is not a transition
    note_health_reason("example.com/r", ["d1"], "xid")
    note_health_reason("example.com/other", ["d0"], "elsewhere")
    publish(Health.HEALTHY, Health.UNHEALTHY)
    note_health_reason("example.com/r", ["d0"], "stale")  # d0 does not change: forgotten
    publish(Health.HEALTHY, Health.HEALTHY)
    publish(Health.UNHEALTHY, Health.HEALTHY)
    assert counters.transitions == {
        ("Healthy", "unspecified"): 2,
        ("Unhealthy", "xid"): 1,
        ("Unhealthy", "unspecified"): 1,
    }


def test_event_counter_is_declared_once_and_validated() -> None:
    counter = event_counter("devplug_test_things_total", "Things.", ["kind"])
    assert event_counter("devplug_test_things_total", "Things.", ["kind"]) is counter
    counter.inc("a")
    counter.inc("a", amount=2)
    assert counter.samples() == [(("a",), 3)]
    with pytest.raises(ValueError, match="takes 1 label values"):
        counter.inc()
    with pytest.raises(ValueError, match="declared with labels"):
        event_counter("devplug_test_things_total", "Things.", ["other"])
    with pytest.raises(ValueError, match="ending in _total"):
        event_counter("devplug_things", "No suffix.")
    with pytest.raises(ValueError, match="invalid label names"):
        event_counter("devplug_test_other_total", "Bad label.", ["__x"])


def test_require_prometheus_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(devplug.ConfigError, match=r"pip install 'devplug\[metrics\]'"):
        devplug.metrics.require_prometheus()


@pytest.mark.anyio
async def test_readiness_conditions_and_exposition_in_process(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    why: list[str] = ["no devices found yet"]
    plugin = Widgets()
    async with FakeKubelet(settings.device_plugin_dir) as kubelet:
        async with serving(plugin, settings) as runner:
            runner.add_readiness(lambda: why[0] if why else None)
            await kubelet.wait_for_devices("example.com/widget")
            await wait_until(lambda: runner.resources["example.com/widget"].stats.streams == 1)
            assert runner.readiness() == (False, ["no devices found yet"])
            why.clear()
            assert runner.readiness() == (True, [])
            plugin.set_health("w1", Health.UNHEALTHY)
            await kubelet.wait_for_devices("example.com/widget", lambda ds: not ds[1].healthy)
            await kubelet.allocate("example.com/widget", ["w0"])
            body, content_type = render(registry_for(runner, [DevicePluginCollector(runner)]), "")
            state = runner.debug_state()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    r = ("resource", "example.com/widget")
    assert samples[("devplug_rpc_requests_total", (("method", "Allocate"), r))] == 1
    assert samples[("devplug_devices", (("health", "Unhealthy"), r))] == 1
    assert (
        samples[("devplug_health_transitions_total", (("health", "Unhealthy"), ("reason", "unspecified"), r))]
        == 1
    )
    assert json.loads(json.dumps(state))["resources"]["example.com/widget"]["last_sent"]["version"] == 2


@pytest.mark.anyio
async def test_watcher_mode_ready_after_notify(short_dir: Path) -> None:
    settings = settings_for(short_dir, registration="watcher")
    async with FakeKubelet(
        settings.device_plugin_dir, plugins_registry_dir=settings.plugins_registry_dir
    ) as kubelet:
        async with serving(Widgets(), settings) as runner:
            await kubelet.wait_for_devices("example.com/widget", timeout=10)
            await wait_until(lambda: runner.readiness()[0])
            assert runner.resources["example.com/widget"].stats.watcher_status == (True, "")


@pytest.mark.anyio
async def test_nvidia_xids_are_counted_by_code_and_verdict(tmp_path: Path) -> None:
    from devplug_nvidia._gpu._health import XID_EVENTS

    before = dict(XID_EVENTS.samples())
    async with monitoring("pcie-a10", tmp_path) as m:
        m.fake.push_xid(1, 94)
        m.fake.push_xid(2, 79)
        m.fake.push_xid(0, 13)
        await wait_until(
            lambda: (
                sum(XID_EVENTS.samples()[i][1] for i in range(len(XID_EVENTS.samples())))
                >= sum(before.values()) + 3
            )
        )
    after = dict(XID_EVENTS.samples())
    for key in (("94", "recoverable"), ("79", "fatal"), ("13", "ignored")):
        assert after[key] == before.get(key, 0) + 1
