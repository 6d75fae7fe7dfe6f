"""The real kubectl against FakeKubeAPI and a real kube-apiserver: the same commands, the same outcomes.

Each test runs twice through the ``kube`` fixture (tests/testing/kubeapi/real_api.py). kubectl comes from
the same assets directory as the real API server (KUBEBUILDER_ASSETS; ``e2e/node build`` makes
one); without it the tests are skipped with the reason, and fail where ``DEVPLUG_E2E_REQUIRED``
is set. The last test checks FakeKubeAPI's OpenAPI documents against the real server's.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.testing.kubeapi.real_api import ROOT, Kube, RealAPI, assets, kube, real_api_server  # noqa: F401  (fixtures)
from tests.testing.kubeapi.test_kubeapi_kit import SLICES

pytestmark = pytest.mark.anyio

DRIVER = "kubectl.example.com"
NODE = "kubectl-node"
SLICE = "kubectl-slice"
CLAIM = "kubectl-claim"


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Kubectl:
    """kubectl with a kubeconfig for one server and a cache of its own."""

    def __init__(self, binary: Path, kubeconfig: Path, cache: Path, work: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.cache = cache
        self.work = work

    async def __call__(self, *args: str, stdin: str | None = None) -> Result:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache}", *args]
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.work)}  # no proxies, no user config
        done = await anyio.run_process(
            argv, input=stdin.encode() if stdin is not None else None, check=False, env=env
        )
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())

    async def ok(self, *args: str, stdin: str | None = None) -> str:
        result = await self(*args, stdin=stdin)
        assert result.rc == 0, f"kubectl {' '.join(args)}: rc {result.rc}: {result.err}"
        return result.out

    async def get(self, *args: str) -> Any:
        return json.loads(await self.ok("get", *args, "-o", "json"))

    def manifest(self, name: str, *objects: dict[str, Any]) -> str:
        path = self.work / name
        path.write_text(yaml.safe_dump_all(objects))
        return str(path)


def _binary() -> Path:
    binary = assets() / "kubectl"
    if not binary.is_file():
        reason = f"no kubectl in {assets()} (KUBEBUILDER_ASSETS; e2e/node build makes one)"
        if os.environ.get("DEVPLUG_E2E_REQUIRED"):
            pytest.fail(reason, pytrace=False)
        print(f"skipped: {reason}")
        pytest.skip(reason)
    return binary


@pytest.fixture
async def kubectl(kube: Kube, tmp_path: Path) -> Kubectl:  # noqa: F811
    binary = _binary()
    if kube.fake is not None:
        config = kube.fake.write_kubeconfig(tmp_path / "kubeconfig")
    else:
        assert kube.real is not None
        config = kube.real.kubeconfig
    run = Kubectl(binary, config, tmp_path / "cache", tmp_path)
    # What an earlier test against the real server may have left.
    await run("delete", "resourceclaim", CLAIM, "nodes", NODE, "--ignore-not-found", "--wait=false")
    await run("delete", "node", NODE, "--ignore-not-found", "--wait=false")
    return run


def a_slice(device: str = "gpu-0", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE, "labels": {"app": "kubectl-test", **labels}},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": "pool-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device}],
        },
    }


def a_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}
        },
    }


def a_node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"node-role.kubernetes.io/worker": "", "zone": "a"}},
    }


WIDE = ("KERNEL-VERSION", "CONTAINER-RUNTIME")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _columns(out: str) -> list[list[str]]:
    """A table's lines split into cells, the AGE column (time-dependent) left out."""
    lines = [re.split(r"\s{2,}", line.strip()) for line in out.strip().splitlines()]
    header = lines[0]
    if "AGE" not in header:
        return lines
    at = header.index("AGE")
    return [cells[:at] + cells[at + 1 :] for cells in lines]


async def test_apply_creates_then_patches_then_deletes(kubectl: Kubectl) -> None:
    first = kubectl.manifest("slice.yaml", a_slice())
    assert (
        await kubectl.ok("apply", "-f", first)
    ).strip() == f"resourceslice.resource.k8s.io/{SLICE} created"
    created = await kubectl.get("resourceslice", SLICE)
    applied = json.loads(created["metadata"]["annotations"][LAST_APPLIED])
    expected = a_slice()
    expected["metadata"]["annotations"] = {}
    assert applied == expected
    assert created["spec"]["devices"] == [{"name": "gpu-0"}]
    assert created["metadata"]["generation"] == 1

    second = kubectl.manifest("slice.yaml", a_slice("gpu-1", tier="gold"))
    out = await kubectl.ok("apply", "-f", second)
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} configured"
    changed = await kubectl.get("resourceslice", SLICE)
    assert changed["spec"]["devices"] == [{"name": "gpu-1"}]
    assert changed["metadata"]["labels"] == {"app": "kubectl-test", "tier": "gold"}
    assert changed["metadata"]["generation"] == 2
    assert json.loads(changed["metadata"]["annotations"][LAST_APPLIED])["spec"]["devices"] == [
        {"name": "gpu-1"}
    ]
    assert changed["metadata"]["uid"] == created["metadata"]["uid"]

    out = await kubectl.ok("apply", "-f", second)
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} unchanged"
    # A label the manifest drops is removed: the last-applied annotation says it was ours.
    out = await kubectl.ok("apply", "-f", kubectl.manifest("slice.yaml", a_slice("gpu-1")))
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} configured"
    assert (await kubectl.get("resourceslice", SLICE))["metadata"]["labels"] == {"app": "kubectl-test"}

    out = await kubectl.ok("delete", "-f", second)
    assert out.strip() == f'resourceslice.resource.k8s.io "{SLICE}" deleted'
    gone = await kubectl("get", "resourceslice", SLICE)
    assert gone.rc == 1
    assert (
        gone.err.strip()
        == f'Error from server (NotFound): resourceslices.resource.k8s.io "{SLICE}" not found'
    )


async def test_apply_of_several_kinds_and_strict_validation(kubectl: Kubectl) -> None:
    both = kubectl.manifest("all.yaml", a_node(), a_slice(), a_claim())
    out = await kubectl.ok("apply", "-f", both)
    assert out.splitlines() == [
        f"node/{NODE} created",
        f"resourceslice.resource.k8s.io/{SLICE} created",
        f"resourceclaim.resource.k8s.io/{CLAIM} created",
    ]
    assert LAST_APPLIED in (await kubectl.get("node", NODE))["metadata"]["annotations"]
    assert LAST_APPLIED in (await kubectl.get("resourceclaim", CLAIM))["metadata"]["annotations"]

    bogus = a_slice()
    bogus["spec"]["bogus"] = 1
    refused = await kubectl("apply", "-f", kubectl.manifest("bogus.yaml", bogus))
    assert refused.rc == 1
    assert 'strict decoding error: unknown field "spec.bogus"' in refused.err
    # a strict PATCH that leaves unknown fields is 422 on the patch, not 400 as a create is
    assert refused.err.startswith(
        'The request is invalid: patch: Invalid value: "map[metadata:map[annotations:'
    )

    out = await kubectl.ok("delete", "-f", both)
    assert out.splitlines() == [
        f'node "{NODE}" deleted',
        f'resourceslice.resource.k8s.io "{SLICE}" deleted',
        f'resourceclaim.resource.k8s.io "{CLAIM}" deleted from default namespace',
    ]


async def test_server_side_apply(kubectl: Kubectl, kube: Kube) -> None:  # noqa: F811
    result = await kubectl("apply", "--server-side", "-f", kubectl.manifest("slice.yaml", a_slice()))
    if kube.fake is None:
        assert result.rc == 0, result.err
        assert result.out.strip() == f"resourceslice.resource.k8s.io/{SLICE} serverside-applied"
        return
    # A deliberate simplification of the fake: no server-side apply, and it says so.
    assert result.rc == 1
    assert result.err.startswith("error: Server-side apply not available on the server: (")  # kubectl's words
    assert "server-side apply is not supported by FakeKubeAPI" in result.err


async def test_get_prints_the_api_servers_tables(kubectl: Kubectl) -> None:
    await kubectl.ok("apply", "-f", kubectl.manifest("all.yaml", a_node(), a_slice(), a_claim()))
    assert _columns(await kubectl.ok("get", "resourceslices")) == [
        ["NAME", "NODE", "DRIVER", "POOL"],
        [SLICE, NODE, DRIVER, "pool-a"],
    ]
    assert _columns(await kubectl.ok("get", "resourceclaims", "-A")) == [
        ["NAMESPACE", "NAME", "STATE"],
        ["default", CLAIM, "pending"],
    ]
    assert _columns(await kubectl.ok("get", "resourceslice", SLICE, "--show-labels", "-L", "app")) == [
        ["NAME", "NODE", "DRIVER", "POOL", "APP", "LABELS"],
        [SLICE, NODE, DRIVER, "pool-a", "kubectl-test", "app=kubectl-test"],
    ]
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ready",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "nodeInfo": {
                "kubeletVersion": "v1.37.2",
                "osImage": "Debian",
                "kernelVersion": "6.1.0",
                "containerRuntimeVersion": "containerd://2.1.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        }
    }
    nodes = ("get", "node", NODE, "-o", "wide")
    assert _columns(await kubectl.ok(*nodes)) == [
        [*("NAME", "STATUS", "ROLES", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE"), *WIDE],
        [NODE, "Unknown", "worker", "<none>", "<none>", "<unknown>", "<unknown>", "<unknown>"],
    ]
    await kubectl.ok("patch", "node", NODE, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    await kubectl.ok("cordon", NODE)
    assert _columns(await kubectl.ok(*nodes))[1] == [
        NODE,
        "Ready,SchedulingDisabled",
        "worker",
        "v1.37.2",
        "10.0.0.7",
        "<none>",
        "Debian",
        "6.1.0 (amd64)",
        "containerd://2.1.0",
    ]
    claim_status = ("patch", "resourceclaim", CLAIM, "--subresource=status", "--type=merge", "-p")
    result = {"request": "gpu", "driver": DRIVER, "pool": "pool-a", "device": "gpu-0"}
    await kubectl.ok(
        *claim_status, json.dumps({"status": {"allocation": {"devices": {"results": [result]}}}})
    )
    state = ("get", "resourceclaim", CLAIM, "-o", "custom-columns=NAME:.metadata.name")
    consumer = {"resource": "pods", "name": "p", "uid": "0b5c3b6c-0c1a-4b7e-9d6a-1b2c3d4e5f60"}
    assert _columns(await kubectl.ok("get", "resourceclaim", CLAIM))[1] == [CLAIM, "allocated"]
    await kubectl.ok(*claim_status, json.dumps({"status": {"reservedFor": [consumer]}}))
    assert _columns(await kubectl.ok("get", "resourceclaim", CLAIM))[1] == [CLAIM, "allocated,reserved"]
    finalizer = '{"metadata":{"finalizers":["example.com/x"]}}'
    await kubectl.ok("patch", "resourceclaim", CLAIM, "--type=merge", "-p", finalizer)
    await kubectl.ok(*claim_status, '{"status":{"reservedFor":null}}')
    assert _columns(await kubectl.ok("get", "resourceclaim", CLAIM))[1] == [CLAIM, "allocated"]
    await kubectl.ok(
        "patch", "resourceclaim", CLAIM, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
    )
    assert (await kubectl.ok(*state)).split() == ["NAME", CLAIM]
    await kubectl.ok("delete", "-f", kubectl.work / "all.yaml")


async def test_output_formats_and_selectors(kubectl: Kubectl) -> None:
    await kubectl.ok("apply", "-f", kubectl.manifest("slice.yaml", a_slice()))
    as_yaml = yaml.safe_load(await kubectl.ok("get", "resourceslice", SLICE, "-o", "yaml"))
    assert as_yaml["spec"] == a_slice()["spec"]
    assert "managedFields" not in as_yaml["metadata"]  # kubectl hides them where there are some
    name = await kubectl.ok("get", "resourceslices", "-l", "app=kubectl-test", "-o", "name")
    assert name.strip() == f"resourceslice.resource.k8s.io/{SLICE}"
    assert (await kubectl.ok("get", "resourceslices", "-l", "app=other", "-o", "name")).strip() == ""
    by_driver = await kubectl.get("resourceslices", f"--field-selector=spec.driver={DRIVER}")
    assert [item["metadata"]["name"] for item in by_driver["items"]] == [SLICE]
    by_pool = await kubectl.get("resourceslices", "--field-selector=spec.pool.name=pool-b")
    assert by_pool["items"] == []
    refused = await kubectl("get", "resourceslices", "--field-selector=spec.devices=x")
    assert refused.rc == 1
    assert refused.err.strip() == (
        'Error from server (BadRequest): Unable to find "resource.k8s.io/v1, Resource=resourceslices" that '
        'match label selector "", field selector "spec.devices=x": field label not supported for '
        "resource.k8s.io/v1, Kind=ResourceSlice: spec.devices"
    )
    jsonpath = await kubectl.ok("get", "resourceslice", SLICE, "-o", "jsonpath={.spec.pool.name}")
    assert jsonpath == "pool-a"
    none = await kubectl("get", "resourceslices", "--field-selector=spec.driver=none.example.com")
    assert (none.rc, none.out, none.err.strip()) == (0, "", "No resources found")


async def test_patch_label_and_describe(kubectl: Kubectl) -> None:
    await kubectl.ok("apply", "-f", kubectl.manifest("slice.yaml", a_slice()))
    out = await kubectl.ok("label", "resourceslice", SLICE, "colour=blue")
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} labeled"
    out = await kubectl.ok(
        "patch",
        "resourceslice",
        SLICE,
        "--type=merge",
        "-p",
        '{"metadata":{"labels":{"colour":null,"x":"1"}}}',
    )
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} patched"
    out = await kubectl.ok(
        "patch",
        "resourceslice",
        SLICE,
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/devices/0/name","value":"g"}]',
    )
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} patched"
    got = await kubectl.get("resourceslice", SLICE)
    assert got["metadata"]["labels"] == {"app": "kubectl-test", "x": "1"}
    assert got["spec"]["devices"] == [{"name": "g"}]
    out = await kubectl.ok("label", "resourceslice", SLICE, "x-")
    assert out.strip() == f"resourceslice.resource.k8s.io/{SLICE} unlabeled"

    described = await kubectl.ok("describe", "resourceslice", SLICE)
    lines = [line.rstrip() for line in described.splitlines()]
    assert lines[:6] == [
        f"Name:         {SLICE}",
        "Namespace:",
        "Labels:       app=kubectl-test",
        "Annotations:  <none>",
        "API Version:  resource.k8s.io/v1",
        "Kind:         ResourceSlice",
    ]
    assert "  Driver:     kubectl.example.com" in lines
    assert lines[-1].startswith("Events:") and lines[-1].endswith("<none>")

    await kubectl.ok("apply", "-f", kubectl.manifest("node.yaml", a_node()))
    node = await kubectl.ok("describe", "node", NODE)
    assert f"Name:               {NODE}" in node
    assert "Node-Local ResourceSlices:" in node
    assert re.search(rf"{DRIVER}\s+pool-a\s+1\s+1", node)
    assert "Non-terminated Pods:          (0 in total)" in node
    await kubectl.ok("delete", "node", NODE)


async def test_explain_reads_the_openapi_document(kubectl: Kubectl) -> None:
    out = await kubectl.ok("explain", "resourceslice.spec.pool")
    assert "KIND:       ResourceSlice" in out
    assert re.search(r"generation\s+<integer> -required-", out)
    assert re.search(r"resourceSliceCount\s+<integer> -required-", out)
    assert "FIELD: pool <ResourcePool>" in out


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_openapi", ROOT / "scripts" / "gen_openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_openapi"] = module
    spec.loader.exec_module(module)
    return module


def test_openapi_documents_match_the_real_api_server(real_api_server: RealAPI) -> None:  # noqa: F811
    gen = _generator()
    fresh = gen.build(gen.fetcher(real_api_server.url, real_api_server.token, real_api_server.ca))
    assert fresh == gen.TARGET.read_bytes(), "run: python scripts/gen_openapi.py"
    assert len(fresh) < 100_000
    assert b'"description"' not in gzip.decompress(fresh)


async def test_strategic_merge_patches_follow_the_schema(kubectl: Kubectl) -> None:
    finalized = a_slice()
    finalized["metadata"]["finalizers"] = ["example.com/a", "example.com/b"]
    await kubectl.ok("apply", "-f", kubectl.manifest("slice.yaml", finalized))
    finalized["metadata"]["finalizers"] = ["example.com/b"]
    # kubectl sends $deleteFromPrimitiveList/finalizers and $setElementOrder/finalizers
    await kubectl.ok("apply", "-f", kubectl.manifest("slice.yaml", finalized))
    got = await kubectl.get("resourceslice", SLICE)
    assert got["metadata"]["finalizers"] == ["example.com/b"]
    assert "$setElementOrder/finalizers" not in got["metadata"]
    await kubectl.ok(
        "patch", "resourceslice", SLICE, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
    )
    await kubectl.ok("delete", "resourceslice", SLICE)

    await kubectl.ok("apply", "-f", kubectl.manifest("node.yaml", a_node()))
    ready = {"type": "Ready", "status": "False", "reason": "Starting", "message": "not yet"}
    status = ("patch", "node", NODE, "--subresource=status", "-p")
    await kubectl.ok(*status, json.dumps({"status": {"conditions": [ready]}}))
    pressure = {"type": "MemoryPressure", "status": "False", "reason": "Fine", "message": "ok"}
    # a strategic merge patch (kubectl's default) merges conditions by type
    await kubectl.ok(*status, json.dumps({"status": {"conditions": [pressure, {**ready, "status": "True"}]}}))
    conditions = (await kubectl.get("node", NODE))["status"]["conditions"]
    # the patch's items in its order, as the API server orders a merged list
    assert [(c["type"], c["status"]) for c in conditions] == [("MemoryPressure", "False"), ("Ready", "True")]
    gone = {"$patch": "delete", "type": "MemoryPressure"}
    await kubectl.ok(*status, json.dumps({"status": {"conditions": [gone]}}))
    conditions = (await kubectl.get("node", NODE))["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Ready"]
    await kubectl.ok("delete", "node", NODE)


async def test_strategic_merge_orders_merged_lists_as_the_api_server(kube: Kube) -> None:  # noqa: F811
    """Items the patch names come in its order; stored items it does not name keep their place."""
    node = "/api/v1/nodes/smp-node"
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    steps: list[tuple[str, dict[str, Any], list[str]]] = [
        ("/status", {"status": {"conditions": [{"type": "Ready"}, {"type": "MP"}]}}, ["Ready", "MP"]),
        ("/status", {"status": {"conditions": [{"type": "X"}]}}, ["X", "Ready", "MP"]),
        ("/status", {"status": {"conditions": [{"type": "MP", "status": "False"}]}}, ["X", "Ready", "MP"]),
        (
            "/status",
            {"status": {"conditions": [{"type": "MP"}, {"type": "Y"}, {"type": "Ready"}]}},
            ["X", "MP", "Y", "Ready"],
        ),
        ("", {"metadata": {"finalizers": ["a.io/a", "a.io/b"]}}, ["a.io/a", "a.io/b"]),
        ("", {"metadata": {"finalizers": ["a.io/c"]}}, ["a.io/c", "a.io/a", "a.io/b"]),
        ("", {"metadata": {"finalizers": ["a.io/b", "a.io/d"]}}, ["a.io/c", "a.io/a", "a.io/b", "a.io/d"]),
        (
            "",
            {
                "metadata": {
                    "$setElementOrder/finalizers": ["a.io/d", "a.io/c"],
                    "$deleteFromPrimitiveList/finalizers": ["a.io/a", "a.io/b"],
                }
            },
            ["a.io/d", "a.io/c"],
        ),
    ]
    async with kube.raw() as http:
        await http.request("DELETE", node)
        created = await http.post(
            "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "smp-node"}}
        )
        assert created.status_code == 201, created.text
        try:
            for sub, patch, expected in steps:
                answer = await http.patch(node + sub, content=json.dumps(patch), headers=smp)
                assert answer.status_code == 200, answer.text
                obj = answer.json()
                if sub:
                    assert [c["type"] for c in obj["status"]["conditions"]] == expected
                else:
                    assert obj["metadata"]["finalizers"] == expected
        finally:
            await http.patch(node, content='{"metadata":{"finalizers":null}}', headers=smp)
            await http.request("DELETE", node)


TABLE = (  # what kubectl get sends
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)


async def test_tables_over_http(kube: Kube) -> None:  # noqa: F811
    body = a_slice()
    async with kube.raw() as http:
        created = await http.post(SLICES, json=body)
        assert created.status_code == 201, created.text
        listed = (await http.get(SLICES, headers={"Accept": TABLE}, params={"limit": "500"})).json()
        assert (listed["kind"], listed["apiVersion"]) == ("Table", "meta.k8s.io/v1")
        assert [c["name"] for c in listed["columnDefinitions"]] == ["Name", "Node", "Driver", "Pool", "Age"]
        assert [c["format"] for c in listed["columnDefinitions"]] == ["name", "", "", "", ""]
        assert listed["metadata"]["resourceVersion"]
        [row] = listed["rows"]
        assert row["cells"][:4] == [SLICE, NODE, DRIVER, "pool-a"]
        assert row["object"]["kind"] == "PartialObjectMetadata"
        assert row["object"]["metadata"]["labels"] == body["metadata"]["labels"]
        one = await http.get(f"{SLICES}/{SLICE}", headers={"Accept": TABLE}, params={"includeObject": "None"})
        assert one.json()["rows"][0]["object"] is None
        plain = (await http.get(f"{SLICES}/{SLICE}")).json()
        assert plain["kind"] == "ResourceSlice"
        params = {
            "watch": "1",
            "timeoutSeconds": "2",
            "resourceVersion": plain["metadata"]["resourceVersion"],
        }
        async with http.stream("GET", SLICES, headers={"Accept": TABLE}, params=params) as stream:
            patch = {"metadata": {"labels": {"n": "1"}}}
            headers = {"Content-Type": "application/merge-patch+json"}
            for n in ("1", "2"):
                patch["metadata"]["labels"]["n"] = n
                await http.patch(f"{SLICES}/{SLICE}", content=json.dumps(patch), headers=headers)
            events = []
            async for line in stream.aiter_lines():
                if line.strip():
                    events.append(json.loads(line))
                if len(events) == 2:
                    break
        assert [e["object"]["kind"] for e in events] == ["Table", "Table"]
        assert events[0]["object"]["columnDefinitions"][0]["name"] == "Name"
        assert events[1]["object"]["columnDefinitions"] is None
        assert events[1]["object"]["rows"][0]["object"]["metadata"]["labels"]["n"] == "2"


async def test_openapi_index_and_hashes(kube: Kube) -> None:  # noqa: F811
    async with kube.raw() as http:
        index = (await http.get("/openapi/v3")).json()["paths"]
        for name in ("api/v1", "apis/resource.k8s.io/v1"):
            url = index[name]["serverRelativeURL"]
            answer = await http.get(url)
            assert answer.status_code == 200
            digest = url.rsplit("hash=", 1)[1]
            assert hashlib.sha512(answer.content).hexdigest().upper() == digest
            assert answer.headers["etag"] == f'"{digest}"'
            assert answer.headers["cache-control"] == "public, immutable"
            stale = await http.get(f"/openapi/v3/{name}", params={"hash": "0"})
            assert (stale.status_code, stale.headers["location"]) == (301, url)
            paths = answer.json()["paths"]
            patch = paths[
                f"/{name}/resourceslices/{{name}}" if "resource" in name else "/api/v1/nodes/{name}"
            ]["patch"]
            assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
        missing = await http.get("/openapi/v3/apis/nothing.example.com/v1")
        assert missing.status_code == 404
