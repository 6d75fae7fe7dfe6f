"""Malformed, oversized and odd DRA requests: a status or a per-claim error, never a crash."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplug._proto.dra.v1 import api_pb2 as v1
from devplug.testing import FakeKubeAPI
from tests.dra.dra_kit import NODE, driving, prepare, unprepare
from tests.support import Widgets

pytestmark = pytest.mark.anyio

SERVICE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"


async def call_raw(path: Path, method: str, payload: bytes) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        call = channel.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
        try:
            with anyio.fail_after(10):
                await call(payload, timeout=9)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_garbage_and_odd_requests(short_dir: Path) -> None:
    async with FakeKubeAPI() as api:
        api.add_node(NODE)
        async with driving([Widgets()], api, short_dir) as driver:
            sock = driver.dra_socket
            for payload in (b"\xff\xff\xff", b"\x0a\x05\x0a\x03", bytes(range(256))):
                for method in ("NodePrepareResources", "NodeUnprepareResources"):
                    assert await call_raw(sock, method, payload) in (
                        grpc.StatusCode.OK,  # some bytes parse as a (strange) valid message
                        grpc.StatusCode.INTERNAL,
                        grpc.StatusCode.UNKNOWN,
                        grpc.StatusCode.INVALID_ARGUMENT,
                    )
            big = v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace="ns", name="n" * 200, uid=f"u{i}") for i in range(20_000)]
            ).SerializeToString()
            assert len(big) > 4 * 1024 * 1024
            assert await call_raw(sock, "NodePrepareResources", big) == grpc.StatusCode.RESOURCE_EXHAUSTED
            odd = await prepare(sock, ("", "x", "u1"), ("ns", "", "u2"), ("ns", "x", ""))
            assert set(odd) == {"u1", "u2", ""}
            assert all("lacks a UID, namespace or name" in r.error for r in odd.values())
            many = await unprepare(sock, *[("ns", f"c{i}", f"u{i}") for i in range(500)])
            assert len(many) == 500
            assert all(r.error == "" for r in many.values())
            # Still serving.
            api.add_claim("ns", "ok", requests=[("w", 1)])
            uid = api.allocate_claim("ns", "ok", node=NODE, driver="widget.example.com", count=1)["metadata"][
                "uid"
            ]
            assert (await prepare(sock, ("ns", "ok", uid)))[uid].error == ""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.text(max_size=30), st.text(max_size=30), st.text(max_size=40)), max_size=6))
def test_any_claim_names_get_an_entry_each(claims: list[tuple[str, str, str]]) -> None:
    from devplug._dra.claims import _distinct
    from devplug.dra import ClaimRef

    refs = [ClaimRef(*c) for c in claims]
    unique, outcomes = _distinct(refs)
    assert {r.uid for r in unique} | set(outcomes) == {r.uid for r in refs}
    assert not {r.uid for r in unique} & set(outcomes)
