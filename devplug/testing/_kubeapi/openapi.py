"""The OpenAPI v3 documents of the fake API server: ``/openapi/v3`` and one per group-version.

kubectl reads them for ``apply`` (the patch strategies of lists), for ``--validate`` (whether the
server takes ``fieldValidation``) and for ``explain``. They are the real kube-apiserver's own
documents cut down to the kinds served here, without descriptions (package data made by
scripts/gen_openapi.py, which tests/testing/kubeapi/test_kubeapi_kubectl.py checks against a real one).
As there, the index names each document with the SHA-512 of its bytes; a request with that
``hash`` may be cached for good, one with a stale hash is redirected to the current one.
``/openapi/v2`` is a document without paths (:func:`answer_v2`).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from importlib import resources
from typing import Any

from devplug.testing._kubeapi.httpserver import Response

PREFIX = "/openapi/v3"
_DATA = "openapi.json.gz"


@functools.cache
def documents() -> dict[str, Any]:
    """The group-version documents by name (``api/v1``, ``apis/resource.k8s.io/v1``), as parsed JSON."""
    data = resources.files("devplug.testing._kubeapi").joinpath(_DATA).read_bytes()
    loaded: dict[str, Any] = json.loads(gzip.decompress(data))
    return loaded


@functools.cache
def _served() -> dict[str, tuple[bytes, str]]:
    """Each document's bytes and hash."""
    served = {}
    for name, doc in documents().items():
        body = json.dumps(doc, separators=(",", ":")).encode()
        served[name] = (body, hashlib.sha512(body).hexdigest().upper())
    return served


def answer(path: str, query: dict[str, str]) -> Response | None:
    """The answer to a GET of ``path`` under ``/openapi/v3``, or None (not found)."""
    if path == PREFIX:
        index = {
            name: {"serverRelativeURL": f"{PREFIX}/{name}?hash={digest}"}
            for name, (_, digest) in sorted(_served().items())
        }
        body = json.dumps({"paths": index}, separators=(",", ":")).encode()
        return Response(200, body, content_type="text/plain; charset=utf-8")  # sic, as the API server
    found = _served().get(path.removeprefix(PREFIX + "/"))
    if found is None:
        return None
    body, digest = found
    etag = ("Etag", f'"{digest}"')
    wanted = query.get("hash")
    if wanted is None:
        return Response(200, body, headers=[etag])
    if wanted != digest:
        return Response(301, b"", headers=[etag, ("Location", f"{path}?hash={digest}")])
    return Response(200, body, headers=[etag, ("Cache-Control", "public, immutable")])


V2 = "/openapi/v2"


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (the lengths here are under 128: one byte)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def answer_v2(version: str) -> Response:
    """``/openapi/v2``: a Swagger 2.0 document with no paths, as gnostic's protobuf (what kubectl asks for).

    kubectl turns to it when the v3 documents do not describe a kind (a DeviceClass, a Pod): it
    then finds the kind in neither, validates on the client and, through discovery, reports that
    the kind is not served (instead of failing with "failed to download openapi").
    """
    info = _field(1, b"Kubernetes") + _field(2, version.encode())
    body = _field(1, b"2.0") + _field(2, info) + _field(8, b"")
    return Response(200, body, content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
