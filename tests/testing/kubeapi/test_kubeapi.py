"""FakeKubeAPI over real HTTP, driven by lightkube: lifecycle, objects, errors, selectors, writes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.types import PatchType

from devplug.testing import FakeKubeAPI
from tests.testing.kubeapi.real_api import Kube
from tests.testing.kubeapi.test_kubeapi_kit import DRIVER, NODE, SLICES, device, post_slice, raw, slice_body

pytestmark = pytest.mark.anyio


async def create(client: lightkube.AsyncClient, **kwargs: object) -> ResourceSlice:
    return await client.create(ResourceSlice.from_dict(slice_body(**kwargs)))


@pytest.fixture
async def client(kube: Kube) -> AsyncIterator[lightkube.AsyncClient]:
    """Every test here that takes `client` or `kube` runs twice: against FakeKubeAPI and against a
    real kube-apiserver with etcd (tests/testing/kubeapi/real_api.py), with the same assertions."""
    async with kube.client() as c:
        yield c


async def test_lifecycle_kubeconfig_and_discovery(tmp_path: Path) -> None:
    api = FakeKubeAPI()
    with pytest.raises(RuntimeError):
        _ = api.url
    async with api:
        assert api.url.startswith("http://127.0.0.1:")
        path = api.write_kubeconfig(tmp_path / "kubeconfig")
        config = lightkube.KubeConfig.from_file(path)
        async with lightkube.AsyncClient(config, trust_env=False) as c:
            api.add_node("n")
            assert [n.metadata.name async for n in c.list(Node)] == ["n"]
        async with raw(api.url) as http:
            version = (await http.get("/version")).json()
            group = (await http.get("/apis/resource.k8s.io/v1")).json()
            missing = await http.get("/apis/resource.k8s.io/v1beta1/resourceslices")
        assert version["major"] == "1"
        assert {r["name"] for r in group["resources"]} >= {
            "resourceslices",
            "resourceclaims",
            "resourceclaims/status",
        }
        assert missing.status_code == 404
        assert missing.json()["kind"] == "Status"
    await api.stop()  # twice is fine
    with pytest.raises(RuntimeError, match="already running"):
        async with api:
            await api.start()


async def test_create_get_and_server_fields(kube: Kube, client: lightkube.AsyncClient) -> None:
    created = await create(client)
    assert created.metadata.uid
    assert created.metadata.generation == 1
    assert created.metadata.creationTimestamp is not None
    got = await client.get(ResourceSlice, "s1")
    assert got.metadata.resourceVersion == created.metadata.resourceVersion
    assert got.spec.devices[0].name == "gpu-0"
    second = await create(client, name="s2")
    assert int(second.metadata.resourceVersion) > int(created.metadata.resourceVersion)  # one global counter
    assert await kube.slice_names() == ["s1", "s2"]


async def test_errors_are_status_objects_in_the_api_servers_words(client: lightkube.AsyncClient) -> None:
    with pytest.raises(ApiError) as missing:
        await client.get(ResourceSlice, "x")
    assert missing.value.status.code == 404
    assert missing.value.status.reason == "NotFound"
    assert missing.value.status.message == 'resourceslices.resource.k8s.io "x" not found'
    assert missing.value.status.details.name == "x"
    await create(client)
    with pytest.raises(ApiError) as exists:
        await create(client)
    assert exists.value.status.code == 409
    assert exists.value.status.reason == "AlreadyExists"
    assert exists.value.status.message == 'resourceslices.resource.k8s.io "s1" already exists'


async def test_generate_name_gets_a_five_character_suffix(client: lightkube.AsyncClient) -> None:
    created = await create(client, name=None)
    prefix = f"{NODE}-{DRIVER}-"
    assert created.metadata.name.startswith(prefix)
    suffix = created.metadata.name[len(prefix) :]
    assert len(suffix) == 5
    assert set(suffix) <= set("bcdfghjklmnpqrstvwxz2456789")
    other = await create(client, name=None)
    assert other.metadata.name != created.metadata.name


async def test_list_with_field_and_label_selectors(client: lightkube.AsyncClient) -> None:
    await create(client, name="a")
    await create(client, name="b", driver="net.example.com")
    await create(client, name="c", node="node-2")
    labelled = slice_body("d", node="node-2", pool="other")
    labelled["metadata"]["labels"] = {"tier": "gold"}
    await client.create(ResourceSlice.from_dict(labelled))

    async def names(**kwargs: object) -> list[str]:
        return [s.metadata.name async for s in client.list(ResourceSlice, **kwargs)]

    assert await names(fields={"spec.nodeName": NODE}) == ["a", "b"]
    assert await names(fields={"spec.nodeName": NODE, "spec.driver": DRIVER}) == ["a"]
    assert await names(fields={"spec.pool.name": "other"}) == ["d"]
    assert await names(fields={"metadata.name": "c"}) == ["c"]
    assert await names(labels={"tier": "gold"}) == ["d"]
    assert await names(chunk_size=1) == ["a", "b", "c", "d"]  # limit and continue
    with pytest.raises(ApiError) as bad:
        await names(fields={"spec.devices": "x"})
    assert bad.value.status.code == 400
    assert bad.value.status.message == (
        "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.devices"
    )


async def test_update_conflicts_on_a_stale_resource_version(client: lightkube.AsyncClient) -> None:
    first = await create(client)
    fresh = await client.get(ResourceSlice, "s1")
    fresh.spec.devices.append(device("gpu-1"))
    updated = await client.replace(fresh)
    assert updated.metadata.generation == 2  # the spec changed
    first.spec.devices = []
    with pytest.raises(ApiError) as stale:
        await client.replace(first)
    assert stale.value.status.code == 409
    assert stale.value.status.reason == "Conflict"
    assert stale.value.status.message == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    same = await client.replace(updated)  # a no-op keeps the resourceVersion
    assert same.metadata.resourceVersion == updated.metadata.resourceVersion


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"driver": "other.example.com"}, "spec.driver"),
        ({"pool": {"name": "other", "generation": 0, "resourceSliceCount": 1}}, "spec.pool.name"),
        ({"nodeName": "node-2"}, "spec.nodeName"),
    ],
)
async def test_immutable_fields(client: lightkube.AsyncClient, change: dict[str, object], path: str) -> None:
    await create(client)
    current = (await client.get(ResourceSlice, "s1")).to_dict()
    current["spec"].update(change)
    with pytest.raises(ApiError) as refused:
        await client.replace(ResourceSlice.from_dict(current))
    assert refused.value.status.code == 422
    assert f"{path}: Invalid value:" in refused.value.status.message
    assert refused.value.status.message.endswith("field is immutable")
    assert refused.value.status.details.causes[0].field == path


async def test_patch_types(kube: Kube, client: lightkube.AsyncClient) -> None:
    await create(client)
    merged = await client.patch(
        ResourceSlice, "s1", {"metadata": {"labels": {"a": "b"}}}, patch_type=PatchType.MERGE
    )
    assert merged.metadata.labels == {"a": "b"}
    strategic = await client.patch(ResourceSlice, "s1", {"spec": {"pool": {"generation": 3}}})
    assert strategic.spec.pool.generation == 3
    assert strategic.metadata.generation == 2
    patched = await client.patch(
        ResourceSlice,
        "s1",
        [{"op": "replace", "path": "/spec/devices/0/name", "value": "gpu-9"}],
        patch_type=PatchType.JSON,
    )
    assert patched.spec.devices[0].name == "gpu-9"
    with pytest.raises(ApiError) as stale:
        await client.patch(
            ResourceSlice, "s1", {"metadata": {"resourceVersion": "1"}}, patch_type=PatchType.MERGE
        )
    assert stale.value.status.code == 409
    with pytest.raises(ApiError) as apply:
        await client.patch(ResourceSlice, "s1", {"spec": {}}, patch_type=PatchType.APPLY, field_manager="t")
    if kube.fake is not None:  # a deliberate simplification (FakeKubeAPI's docstring): no server-side apply
        assert apply.value.status.code == 415
    else:  # the real one applies, and refuses this body, which names no apiVersion and kind
        assert (apply.value.status.code, apply.value.status.message) == (400, "invalid object type: /, Kind=")


async def test_delete_with_preconditions(kube: Kube, client: lightkube.AsyncClient) -> None:
    created = await create(client)
    url = f"{SLICES}/s1"
    async with kube.raw() as http:
        wrong_uid = await http.request("DELETE", url, json={"preconditions": {"uid": "nope"}})
        stale = await http.request("DELETE", url, json={"preconditions": {"resourceVersion": "1"}})
        ok = await http.request(
            "DELETE",
            url,
            json={
                "preconditions": {
                    "uid": created.metadata.uid,
                    "resourceVersion": created.metadata.resourceVersion,
                }
            },
        )
    assert wrong_uid.status_code == 409
    assert wrong_uid.json()["message"] == (
        'Operation cannot be fulfilled on ResourceSlice.resource.k8s.io "s1": the UID in the precondition '
        f"(nope) does not match the UID in record ({created.metadata.uid}). "
        "The object might have been deleted and then recreated"
    )
    assert wrong_uid.json()["details"] == {"name": "s1", "group": "resource.k8s.io", "kind": "ResourceSlice"}
    assert stale.status_code == 409
    assert stale.json()["message"] == (
        'Operation cannot be fulfilled on ResourceSlice.resource.k8s.io "s1": the ResourceVersion in the '
        "precondition (1) does not match the ResourceVersion in record "
        f"({created.metadata.resourceVersion}). The object might have been modified"
    )
    assert ok.status_code == 200  # the deleted object, at the deletion's resourceVersion
    assert ok.json()["kind"] == "ResourceSlice"
    assert ok.json()["metadata"]["uid"] == created.metadata.uid
    assert int(ok.json()["metadata"]["resourceVersion"]) > int(created.metadata.resourceVersion)
    assert await kube.slice_names() == []


async def test_deletecollection_by_field_selector(kube: Kube, client: lightkube.AsyncClient) -> None:
    await create(client, name="a")
    await create(client, name="b", driver="net.example.com")
    await create(client, name="c", node="node-2")
    async with kube.raw() as http:
        answer = await http.delete(
            SLICES, params={"fieldSelector": f"spec.nodeName={NODE},spec.driver={DRIVER}"}
        )
        assert answer.status_code == 200
        assert [i["metadata"]["name"] for i in answer.json()["items"]] == ["a"]
        await http.delete(SLICES, params={"fieldSelector": f"spec.nodeName={NODE}"})  # the kubelet's wipe
    assert await kube.slice_names() == ["c"]
    if kube.fake is not None:
        assert ("deletecollection", SLICES, 200) in kube.fake.requests


async def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(kube: Kube) -> None:
    body = slice_body()
    body["spec"]["devices"][0]["colour"] = "blue"
    async with kube.raw() as http:
        strict = await post_slice(http, body, fieldValidation="Strict")
        warned = await post_slice(http, body)
        stored = (await http.get(f"{SLICES}/s1")).json()
    assert strict.status_code == 400
    assert strict.json()["reason"] == "BadRequest"
    assert strict.json()["message"] == (
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: '
        'strict decoding error: unknown field "spec.devices[0].colour"'
    )
    assert warned.status_code == 201
    assert warned.headers.get_list("Warning") == ['299 - "unknown field \\"spec.devices[0].colour\\""']
    assert "colour" not in json.dumps(stored)


async def test_methods_paths_and_names_the_api_server_refuses(kube: Kube) -> None:
    body = slice_body("s1")
    async with kube.raw() as http:
        missing = await http.put(f"{SLICES}/s1", json=body)
        on_item = await http.post(f"{SLICES}/s1", json=body)
        assert (await post_slice(http, body)).status_code == 201
        renamed = await http.put(f"{SLICES}/other", json=body)
        unknown = await http.get("/apis/resource.k8s.io/v1/devicewidgets")
    assert missing.status_code == 404
    assert missing.json()["message"] == 'resourceslices.resource.k8s.io "s1" not found'
    assert on_item.status_code == 405
    assert on_item.json()["reason"] == "MethodNotAllowed"
    assert renamed.status_code == 400
    assert (
        renamed.json()["message"] == "the name of the object (s1) does not match the name on the URL (other)"
    )
    assert unknown.status_code == 404
