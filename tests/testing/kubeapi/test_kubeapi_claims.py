"""FakeKubeAPI's ResourceClaims and Nodes over HTTP: namespaces, the status subresource, replaced claims."""

from __future__ import annotations

import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice

from devplug.testing import FakeKubeAPI
from tests.testing.kubeapi.test_kubeapi_kit import DRIVER, NODE, device, slice_body

pytestmark = pytest.mark.anyio


async def test_claims_namespaced_listed_across_namespaces_and_status_written(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    api.add_claim("a", "c1")
    api.add_claim("b", "c2")
    assert [c.metadata.name async for c in client.list(ResourceClaim, namespace="*")] == ["c1", "c2"]
    assert [c.metadata.name async for c in client.list(ResourceClaim, namespace="b")] == ["c2"]
    await client.create(ResourceSlice.from_dict(slice_body(devices=[device("gpu-0")])))
    api.allocate_claim("a", "c1", node=NODE, driver=DRIVER)
    claim = await client.get(ResourceClaim, "c1", namespace="a")
    status = claim.to_dict()["status"]
    status["devices"] = [{"driver": DRIVER, "pool": NODE, "device": "gpu-0", "conditions": []}]
    written = await client.replace(
        ResourceClaimStatus.from_dict({**claim.to_dict(), "status": status}), namespace="a"
    )
    assert written.status.devices[0].device == "gpu-0"
    status["devices"] = [{"driver": DRIVER, "pool": NODE, "device": "gpu-7"}]
    with pytest.raises(ApiError) as refused:
        await client.replace(
            ResourceClaimStatus.from_dict({**written.to_dict(), "status": status}), namespace="a"
        )
    assert refused.value.status.code == 422
    assert "must be an allocated device in the claim" in refused.value.status.message
    # The main resource cannot change the status.
    plain = (await client.get(ResourceClaim, "c1", namespace="a")).to_dict()
    plain["status"] = {}
    kept = await client.replace(ResourceClaim.from_dict(plain), namespace="a")
    assert kept.status.allocation is not None


async def test_claim_replaced_under_the_same_name_fails_a_stale_uid(
    api: FakeKubeAPI, client: lightkube.AsyncClient
) -> None:
    old = api.add_claim("ns", "c")
    new = api.replace_claim("ns", "c")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    stale = ResourceClaim.from_dict({**old, "metadata": {**old["metadata"], "resourceVersion": None}})
    with pytest.raises(ApiError) as refused:
        await client.replace(stale, namespace="ns")
    assert refused.value.status.code == 409
    assert "Precondition failed: UID in precondition" in refused.value.status.message


async def test_nodes_get_and_list(api: FakeKubeAPI, client: lightkube.AsyncClient) -> None:
    api.add_node("node-2", uid="u-2")
    assert (await client.get(Node, "node-2")).metadata.uid == "u-2"
    assert [n.metadata.name async for n in client.list(Node)] == [NODE, "node-2"]
    assert [n.metadata.name async for n in client.list(Node, fields={"metadata.name": "node-2"})] == [
        "node-2"
    ]
    with pytest.raises(ApiError) as missing:
        await client.get(Node, "nope")
    assert missing.value.status.message == 'nodes "nope" not found'
