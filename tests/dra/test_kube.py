"""The claim read of every prepare: a plain GET through lightkube's own httpx client.

The same answers and the same errors as lightkube's typed read (kept as the fallback, and
compared here against FakeKubeAPI), and the client's credentials and server path on every GET.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import lightkube
import pytest
from lightkube.config.models import Cluster, User

from devplug._dra.kube import KEEP_ALIVE, Kube, KubeError
from devplug.testing import FakeKubeAPI

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

pytestmark = pytest.mark.anyio

NODE = "node-1"
DRIVER = "widget.example.com"


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    async with FakeKubeAPI() as server:
        server.add_node(NODE)
        yield server


SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "s1"},
    "spec": {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "w0"}, {"name": "w1"}],
    },
}


def kube(api: FakeKubeAPI, *, typed: bool = False) -> Kube:
    client = Kube(api.client())
    if typed:
        client._http = None  # lightkube's typed read, as where its httpx client is not found
    return client


async def outcome(client: Kube, namespace: str, name: str) -> tuple[str, Any]:
    try:
        return "claim", await client.claim(namespace, name)
    except KubeError as exc:
        return "error", (type(exc), str(exc), exc.status, exc.reason)
    finally:
        await client.aclose()


async def test_the_plain_get_is_used_with_lightkube_s_client(api: FakeKubeAPI) -> None:
    client = kube(api)
    try:
        assert client._http is client._client._client._client  # the one lightkube sends through
    finally:
        await client.aclose()


async def test_idle_connections_are_kept_for_the_next_prepare(api: FakeKubeAPI) -> None:
    client = kube(api)
    try:
        # httpx's default is 5 s: a prepare minutes after the last one would make a new connection.
        assert client._http is not None
        assert client._http._transport._pool._keepalive_expiry == KEEP_ALIVE  # type: ignore[attr-defined]
    finally:
        await client.aclose()


async def test_a_connection_the_server_closed_is_not_reused(api: FakeKubeAPI) -> None:
    api.add_claim("ns", "c1")
    client = kube(api)
    try:
        first = await client.claim("ns", "c1")
        api.outage()  # every open connection reset, as an API server restart does
        await anyio.sleep(0.2)
        api.restore()
        assert await client.claim("ns", "c1") == first
    finally:
        await client.aclose()


async def test_a_claim_reads_as_lightkube_reads_it(api: FakeKubeAPI) -> None:
    publisher = kube(api)
    await publisher.create_slice(SLICE)
    await publisher.aclose()
    api.add_claim("ns", "c1", requests=[("w", 2)], device_class=DRIVER)
    allocated = api.allocate_claim("ns", "c1", node=NODE, driver=DRIVER, devices=["w0", "w1"])
    kind, got = await outcome(kube(api), "ns", "c1")
    assert kind == "claim"
    assert (kind, got) == await outcome(kube(api, typed=True), "ns", "c1")
    assert got["metadata"]["uid"] == allocated["metadata"]["uid"]
    assert [r["device"] for r in got["status"]["allocation"]["devices"]["results"]] == ["w0", "w1"]


@pytest.mark.parametrize(
    ("arrange", "status", "message"),
    [
        (lambda api: None, 404, 'resourceclaims.resource.k8s.io "c1" not found'),
        (
            lambda api: api.fail(status=403, verbs=("get",), resource="resourceclaims"),
            403,
            'resourceclaims.resource.k8s.io "c1" is forbidden',
        ),
        (
            lambda api: api.fail(500, ("get",), "resourceclaims", message="etcd is sad"),
            500,
            "etcd is sad",
        ),
        (lambda api: api.outage(), None, "API server unreachable"),
    ],
    ids=["not-found", "forbidden", "server-error", "unreachable"],
)
async def test_errors_are_the_typed_read_s_errors(
    api: FakeKubeAPI, arrange: Callable[[FakeKubeAPI], object], status: int | None, message: str
) -> None:
    arrange(api)
    kind, error = await outcome(kube(api), "ns", "c1")
    assert kind == "error"
    assert error[2] == status
    assert error[1].startswith(message)
    assert (kind, error) == await outcome(kube(api, typed=True), "ns", "c1")


def mocked(cluster: Cluster, user: User, answer: Callable[[httpx2.Request], httpx2.Response]) -> Kube:
    config = lightkube.KubeConfig.from_one(cluster=cluster, user=user, namespace="default")
    return Kube(lightkube.AsyncClient(config, trust_env=False, transport=httpx2.MockTransport(answer)))


TOKEN = "t0ken"  # noqa: S105 (a test's)
CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"uid": "u1"}}


async def test_the_get_carries_the_token_and_the_server_s_path() -> None:
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=CLAIM)

    server = "https://api.example.com:6443/k8s/clusters/c-1"  # behind a proxy with a path
    client = mocked(Cluster(server=server), User(token=TOKEN), answer)
    assert await outcome(client, "ns", "c1") == ("claim", CLAIM)
    (request,) = seen
    assert str(request.url) == f"{server}/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"


async def test_a_rotated_service_account_token_is_read_again(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    sent: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:  # accepts the file's token only
        sent.append(request.headers["Authorization"])
        if request.headers["Authorization"] != f"Bearer {token.read_text().strip()}":
            return httpx2.Response(401, json={"kind": "Status", "code": 401, "message": "Unauthorized"})
        return httpx2.Response(200, json=CLAIM)

    client = mocked(Cluster(server="https://10.0.0.1:443"), User(token_file=str(token)), answer)
    try:
        assert await client.claim("ns", "c1") == CLAIM
        token.write_text("new\n")  # the kubelet rotated the projected token
        assert await client.claim("ns", "c1") == CLAIM
    finally:
        await client.aclose()
    assert sent == ["Bearer old", "Bearer old", "Bearer new"]


async def test_a_non_json_error_answer_is_the_typed_read_s_error() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(502, text="bad gateway", headers={"Content-Type": "text/plain"})

    cluster, user = Cluster(server="https://api.example.com"), User(token=TOKEN)
    raw = await outcome(mocked(cluster, user, answer), "ns", "c1")
    typed_client = mocked(cluster, user, answer)
    typed_client._http = None
    assert raw == await outcome(typed_client, "ns", "c1")
    assert raw[0] == "error"
    assert raw[1][2] is None  # no Status from the server: lightkube's typed read says so too
