"""devplug-fake with --metrics-address: the exposition scraped and parsed as Prometheus does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from devplug import KubeletError
from devplug.testing import FakeKubelet
from tests.metrics.probing import ROOT, env, free_port, get, plugin, wait_for_port
from tests.support import wait_until

pytestmark = pytest.mark.anyio
RESOURCE = "example.com/fake"

# name: (type, label names)
EXPECTED = {
    "devplug_rpc_requests": ("counter", {"resource", "method"}),
    "devplug_rpc_errors": ("counter", {"resource", "method", "code"}),
    "devplug_rpc_duration_seconds": ("histogram", {"resource", "method"}),
    "devplug_registered": ("gauge", {"resource"}),
    "devplug_registrations": ("counter", {"resource", "reason"}),
    "devplug_devices": ("gauge", {"resource", "health"}),
    "devplug_device_list_age_seconds": ("gauge", {"resource"}),
    "devplug_device_lists_sent": ("counter", {"resource"}),
    "devplug_list_and_watch_streams": ("gauge", {"resource"}),
    "devplug_health_transitions": ("counter", {"resource", "health", "reason"}),
    "devplug_ready": ("gauge", set()),
    "devplug_reloads": ("counter", {"result"}),
}


async def scrape(port: int) -> dict[str, Metric]:
    status, headers, body = await get(port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    name = sample.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
    found = [
        s.value
        for s in families[name].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (sample, labels, families[name].samples)
    return found[0]


def write_state(path: Path, unhealthy: set[str]) -> None:
    devices = [
        {"id": f"d{i}", "health": "Unhealthy" if f"d{i}" in unhealthy else "Healthy"} for i in range(4)
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    tmp.replace(path)


async def test_exposition_after_allocates_health_change_and_kubelet_restart(short_dir: Path) -> None:
    dp, state, log = short_dir / "dp", short_dir / "state.json", short_dir / "log"
    write_state(state, set())
    port = free_port()
    args = (
        "--device-plugin-dir",
        str(dp),
        "--state-file",
        str(state),
        "--metrics-address",
        f"127.0.0.1:{port}",
    )
    async with FakeKubelet(dp) as kubelet, plugin(log, "devplug_fake", *args) as process:
        await wait_for_port(port, process, log)
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4, timeout=15)
        for ids in (["d0"], ["d1", "d2"], ["d3"]):
            await kubelet.allocate(RESOURCE, ids)
        with pytest.raises(KubeletError):
            await kubelet.allocate(RESOURCE, ["nope"])
        write_state(state, {"d1"})
        await kubelet.wait_for_devices(RESOURCE, lambda ds: not ds[1].healthy)
        await kubelet.restart()
        await kubelet.wait_for_registration(RESOURCE, count=2)
        await kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 4)

        async def settled() -> dict[str, Metric] | None:
            # Registered again, watched again, and ready: the plugin has seen it all.
            families = await scrape(port)
            return families if value(families, "devplug_ready") == 1 else None

        families = await wait_until(settled, timeout=10, interval=0.05)

    for name, (kind, labels) in EXPECTED.items():
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample)
    devplug_names = {name for name in families if name.startswith("devplug_")}
    assert set(EXPECTED) <= devplug_names
    for family in families.values():
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", family.name)

    r = {"resource": RESOURCE}
    assert value(families, "devplug_rpc_requests_total", method="Allocate", **r) == 4
    assert value(families, "devplug_rpc_errors_total", method="Allocate", code="INVALID_ARGUMENT", **r) == 1
    assert value(families, "devplug_rpc_duration_seconds_count", method="Allocate", **r) == 4
    assert value(families, "devplug_rpc_duration_seconds_bucket", method="Allocate", le="+Inf", **r) == 4
    assert 0 < value(families, "devplug_rpc_duration_seconds_sum", method="Allocate", **r) < 1
    assert value(families, "devplug_rpc_requests_total", method="ListAndWatch", **r) == 2
    assert value(families, "devplug_registered", **r) == 1
    assert value(families, "devplug_registrations_total", reason="start", **r) == 1
    # A kubelet restart deletes the plugin sockets before it creates kubelet.sock again.
    restarted = [
        s.labels["reason"]
        for s in families["devplug_registrations"].samples
        if s.labels["reason"] != "start" and s.name.endswith("_total")
    ]
    assert restarted in (["socket_deleted"], ["kubelet_restarted"])
    assert value(families, "devplug_registrations_total", reason=restarted[0], **r) == 1
    assert value(families, "devplug_devices", health="Healthy", **r) == 3
    assert value(families, "devplug_devices", health="Unhealthy", **r) == 1
    assert (
        value(families, "devplug_health_transitions_total", health="Unhealthy", reason="unspecified", **r)
        == 1
    )
    assert value(families, "devplug_device_lists_sent_total", **r) >= 3
    assert 0 <= value(families, "devplug_device_list_age_seconds", **r) < 10
    assert value(families, "devplug_ready") == 1
    assert value(families, "devplug_reloads_total", result="failed") == 0
    buckets = [
        s.value for s in families["devplug_rpc_duration_seconds"].samples if s.name.endswith("_bucket")
    ]
    assert buckets  # cumulative per label set: never decreasing within one
    assert "process_resident_memory_bytes" in {s.name for f in families.values() for s in f.samples}


async def test_openmetrics_on_request(short_dir: Path) -> None:
    dp, log = short_dir / "dp", short_dir / "log"
    port = free_port()
    async with FakeKubelet(dp) as kubelet:
        args = ("--device-plugin-dir", str(dp), "--metrics-address", f"127.0.0.1:{port}")
        async with plugin(log, "devplug_fake", *args) as process:
            await wait_for_port(port, process, log)
            await kubelet.wait_for_devices(RESOURCE, timeout=15)
            status, headers, body = await get(port, "/metrics", accept="application/openmetrics-text")
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    names = {f.name for f in parse_openmetrics(body.decode())}
    assert {"devplug_rpc_requests", "devplug_registered"} <= names


def run_fake(*args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    script = f"import sys\n{code}\nfrom devplug_fake import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        check=False,
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_missing_extra_is_one_line_and_exit_2(short_dir: Path) -> None:
    # prometheus-client absent: None in sys.modules makes its import fail.
    result = run_fake(
        "--device-plugin-dir",
        str(short_dir),
        "--metrics-address",
        ":0",
        code="sys.modules['prometheus_client'] = None",
    )
    assert result.returncode == 2
    assert (
        result.stderr
        == "devplug-fake: --metrics-address needs prometheus-client: pip install 'devplug[metrics]'\n"
    )


@pytest.mark.parametrize("address", ["9400", "host:", "a:b:c", "[::1]:70000"])
def test_bad_address_is_one_line_and_exit_2(short_dir: Path, address: str) -> None:
    result = run_fake("--device-plugin-dir", str(short_dir), "--metrics-address", address)
    assert result.returncode == 2
    assert result.stderr.startswith("devplug-fake: invalid setting --metrics-address:"), result.stderr
    assert result.stderr.count("\n") == 1


def test_taken_port_is_one_line_and_exit_2(short_dir: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_fake("--device-plugin-dir", str(short_dir), "--metrics-address", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"devplug-fake: invalid setting --metrics-address: cannot listen on 127.0.0.1:{port}"
    )
    assert "Traceback" not in result.stderr
