"""Regenerate FakeKubeAPI's OpenAPI v3 documents from a real kube-apiserver.

    python scripts/gen_openapi.py            # starts etcd + kube-apiserver from KUBEBUILDER_ASSETS
    python scripts/gen_openapi.py --check    # exit 1 when the committed file differs

The API server's ``/openapi/v3/api/v1`` and ``/openapi/v3/apis/resource.k8s.io/v1`` are cut down
to what FakeKubeAPI serves (see :func:`trim`): the paths of its kinds (from ``KINDS``), the
schemas those paths reach, no ``description`` anywhere, and only the media types the fake speaks.
The result is written, gzipped and byte-for-byte reproducible, to
``devplug/testing/_kubeapi/openapi.json.gz`` (package data). tests/testing/kubeapi/test_kubeapi_kubectl.py
checks the committed file against a real API server with the same function, so it cannot drift.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import ssl
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET = ROOT / "devplug" / "testing" / "_kubeapi" / "openapi.json.gz"

# Media types FakeKubeAPI answers in, and the patch types it accepts.
_RESPONSE_TYPES = {"application/json", "application/json;stream=watch"}
_REQUEST_TYPES = {
    "*/*",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
}
_METHODS = {"get", "put", "post", "patch", "delete"}


def served_paths() -> dict[str, set[str]]:
    """The OpenAPI paths FakeKubeAPI serves, by group-version document (``api/v1``, ``apis/<g>/v1``)."""
    from devplug.testing._kubeapi.resources import KINDS

    paths: dict[str, set[str]] = {}
    for kind in KINDS.values():
        doc = kind.prefix.lstrip("/")
        found = paths.setdefault(doc, {f"{kind.prefix}/"})
        scope = f"{kind.prefix}/namespaces/{{namespace}}" if kind.namespaced else kind.prefix
        found |= {f"{scope}/{kind.plural}", f"{scope}/{kind.plural}/{{name}}"}
        if kind.namespaced:
            found.add(f"{kind.prefix}/{kind.plural}")  # the list across namespaces
        if kind.status:
            found.add(f"{scope}/{kind.plural}/{{name}}/status")
    return paths


def _strip(node: Any) -> Any:
    """Without ``description`` strings (prose) at any depth."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.removeprefix("#/components/schemas/"))
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def _operation(op: dict[str, Any]) -> dict[str, Any]:
    op = dict(op)
    responses = {}
    for code, given in op.get("responses", {}).items():
        answer = dict(given)
        if "content" in answer:
            answer["content"] = {t: v for t, v in answer["content"].items() if t in _RESPONSE_TYPES}
        responses[code] = answer
    op["responses"] = responses
    if "requestBody" in op:
        body = dict(op["requestBody"])
        body["content"] = {t: v for t, v in body["content"].items() if t in _REQUEST_TYPES}
        op["requestBody"] = body
    return op


def trim(document: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """One group-version document cut down to the paths in ``keep`` and the schemas they reach."""
    missing = keep - set(document["paths"])
    if missing:
        raise ValueError(f"the API server does not serve {sorted(missing)}")
    paths = {}
    for path in sorted(keep):
        item = document["paths"][path]
        paths[path] = {m: (_operation(v) if m in _METHODS else v) for m, v in item.items()}
    schemas: dict[str, Any] = document["components"]["schemas"]
    wanted: set[str] = set()
    _refs(paths, wanted)
    done: set[str] = set()
    while wanted - done:
        name = sorted(wanted - done)[0]
        done.add(name)
        _refs(schemas[name], wanted)
    return _strip(
        {
            "openapi": document["openapi"],
            "info": document["info"],
            "paths": paths,
            "components": {"schemas": {name: schemas[name] for name in sorted(done)}},
        }
    )


def build(fetch: Any) -> bytes:
    """The gzipped file: ``fetch(path)`` returns the real API server's JSON at ``path``."""
    documents = {doc: trim(fetch(f"/openapi/v3/{doc}"), keep) for doc, keep in sorted(served_paths().items())}
    text = json.dumps(documents, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(text, compresslevel=9, mtime=0)


def fetcher(url: str, token: str, ca: str) -> Any:
    context = ssl.create_default_context(cafile=ca)

    def fetch(path: str) -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        request = urllib.request.Request(url + path, headers=headers)  # noqa: S310  (https, the server started here)
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:  # noqa: S310
            return json.load(answer)

    return fetch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "e2e"))
    import localnode  # e2e/ is not a package

    assets = Path(os.environ.get("KUBEBUILDER_ASSETS") or localnode.k8s_dir(localnode.DEFAULT_K8S) / "assets")
    run = Path(tempfile.mkdtemp(prefix="dpopenapi-", dir="/tmp"))
    try:
        node = localnode.control_plane(run, assets)
        url = f"https://127.0.0.1:{node.state['ports']['apiserver']}"
        data = build(fetcher(url, node.state["token"], str(run / "pki" / "ca.crt")))
    finally:
        localnode.down(run, quiet=True)
        shutil.rmtree(run, ignore_errors=True)
    if args.check:
        same = TARGET.is_file() and TARGET.read_bytes() == data
        print(f"{TARGET.relative_to(ROOT)}: {'up to date' if same else 'out of date'}")
        return 0 if same else 1
    TARGET.write_bytes(data)
    print(f"wrote {TARGET.relative_to(ROOT)} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
