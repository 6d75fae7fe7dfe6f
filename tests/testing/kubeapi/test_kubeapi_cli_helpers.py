"""FakeKubeAPI's fixed port and the claim helpers ``devplug kubelet --dra`` uses."""

from __future__ import annotations

import socket

import pytest

from devplug.testing import FakeKubeAPI


@pytest.mark.anyio
async def test_a_fixed_port_is_kept_and_a_taken_one_is_an_oserror() -> None:
    async with FakeKubeAPI() as first:
        port = int(first.url.rsplit(":", 1)[1])
        with pytest.raises(OSError, match="in use"):
            await FakeKubeAPI(port=port).start()
    async with FakeKubeAPI(port=port) as again:
        assert again.url == f"http://127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port)):
            pass


@pytest.mark.anyio
async def test_claims_and_annotate_claim() -> None:
    async with FakeKubeAPI() as api:
        api.add_claim("a", "one")
        api.add_claim("b", "two")
        assert [c["metadata"]["name"] for c in api.claims()] == ["one", "two"]
        assert [c["metadata"]["name"] for c in api.claims("b")] == ["two"]
        before = api.claim("a", "one")["metadata"]["resourceVersion"]
        annotated = api.annotate_claim("a", "one", {"example.com/x": "y"})
        assert annotated["metadata"]["annotations"] == {"example.com/x": "y"}
        assert annotated["metadata"]["resourceVersion"] != before
        with pytest.raises(LookupError):
            api.annotate_claim("a", "nosuch", {})
