"""Shared pieces of the FakeKubeAPI tests (no tests here): slice bodies and raw HTTP calls."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2

Body = dict[str, Any]
DRIVER = "gpu.example.com"
NODE = "node-1"


def device(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **fields}


def slice_body(
    name: str | None = "s1",
    *,
    node: str | None = NODE,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 0,
    count: int = 1,
    devices: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A valid ResourceSlice (JSON) unless the arguments make it otherwise."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name} if name is not None else {"generateName": f"{node}-{driver}-"},
        "spec": {
            "driver": driver,
            "pool": {"name": pool or node or "pool", "generation": generation, "resourceSliceCount": count},
            "devices": devices if devices is not None else [device("gpu-0")],
        },
    }
    if node is not None:
        body["spec"]["nodeName"] = node
    body["spec"].update(spec)
    if spec.get("sharedCounters") and not body["spec"]["devices"]:
        del body["spec"]["devices"]  # a slice of counter sets: `devices: []` would count as set
    return body


def with_devices(*devices: Body) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["spec"]["devices"] = list(devices)

    return change


def pool(**fields: Any) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["spec"]["pool"].update(fields)

    return change


def taint(key: str = "example.com/hot", effect: str | None = "NoSchedule", **more: Any) -> Body:
    return {"key": key, **({"effect": effect} if effect else {}), **more}


def raw(url: str) -> httpx2.AsyncClient:
    """An HTTP client for what lightkube cannot send (bodies on DELETE, strict validation, raw watches)."""
    return httpx2.AsyncClient(base_url=url, trust_env=False, timeout=10)


SLICES = "/apis/resource.k8s.io/v1/resourceslices"


async def post_slice(http: httpx2.AsyncClient, body: dict[str, Any], **params: str) -> httpx2.Response:
    return await http.post(
        SLICES, content=json.dumps(body), params=params, headers={"Content-Type": "application/json"}
    )
