"""Patch bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as the API server applies them.

A strategic merge patch follows the patch strategies of the kind's OpenAPI schema
(:mod:`devplug.testing._kubeapi.strategic`): most lists of the kinds served here are atomic
(replaced whole); ``metadata.finalizers``, ``ownerReferences``, a claim's ``status.reservedFor``
and a node's ``status.conditions``, ``addresses`` and ``spec.podCIDRs`` merge.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from devplug.testing._kubeapi import strategic
from devplug.testing._kubeapi.status import APIError, bad_request

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
_REJECTED = "the server rejected our request due to an error in our request"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f'{_REJECTED}: invalid JSON pointer "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, key = _parent(doc, parts)
    if isinstance(parent, list):
        parent.insert(len(parent) if key == "-" else int(key), value)
    else:
        parent[key] = value
    return doc


def _remove(doc: Any, path: str) -> Any:
    parent, key = _parent(doc, _pointer(path))
    if isinstance(parent, list):
        del parent[int(key)]
    else:
        del parent[key]
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test."""
    if not isinstance(operations, list):
        raise bad_request(f"{_REJECTED}: json patch must be a list")
    doc = copy.deepcopy(target)
    for op in operations:
        try:
            kind, path = op["op"], op["path"]
            if kind == "add":
                doc = _add(doc, path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                doc = _remove(doc, path)
            elif kind == "replace":
                doc = _add(_remove(doc, path), path, copy.deepcopy(op["value"]))
            elif kind in ("move", "copy"):
                value = copy.deepcopy(_get(doc, op["from"]))
                if kind == "move":
                    doc = _remove(doc, op["from"])
                doc = _add(doc, path, value)
            elif kind == "test":
                if _get(doc, path) != op["value"]:
                    raise APIError(422, "Invalid", f"{_REJECTED}: testing value {path} failed")
            else:
                raise bad_request(f"{_REJECTED}: unexpected kind of operation: {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise APIError(422, "Invalid", f"{_REJECTED}: {exc!r}") from exc
    return doc


def check_type(content_type: str) -> str:
    """The media type of a patch; 415 for one not served (server-side apply among them)."""
    media = content_type.split(";", maxsplit=1)[0].strip()
    if media == APPLY:
        raise APIError(
            415,
            "UnsupportedMediaType",
            f"server-side apply is not supported by FakeKubeAPI ({APPLY}): "
            "use client-side apply (kubectl apply without --server-side) or another patch type",
        )
    if media not in (MERGE, STRATEGIC, JSON_PATCH):
        accepted = ", ".join([JSON_PATCH, MERGE, STRATEGIC])
        raise APIError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: {accepted}",
        )
    return media


def apply(
    target: dict[str, Any], content_type: str, body: bytes, schema: tuple[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The patched object, or an APIError (400 for a bad body, 415 for a patch type not served).

    ``schema`` (the OpenAPI document's name and the kind's schema) gives a strategic merge patch
    the patch strategies of the kind's lists; without it, it is applied as a merge patch.
    """
    media = check_type(content_type)
    try:
        patch = json.loads(body or b"null")
    except ValueError as exc:
        raise bad_request(f"error decoding patch: {exc}") from exc
    if media == JSON_PATCH:
        patched = json_patch(target, patch)
    else:
        if not isinstance(patch, dict):
            why = "json: cannot unmarshal non-object into Go value of type map[string]interface {}"
            raise bad_request(f"error decoding patch: {why}")
        if media == STRATEGIC and schema is not None:
            patched = strategic.merge(schema[0], target, patch, schema[1])
        else:
            patched = merge_patch(copy.deepcopy(target), patch)
    if not isinstance(patched, dict):
        raise bad_request("the patched object is not a JSON object")
    return patched


def _go_value(value: Any) -> str:
    """``value`` as Go's ``%v`` prints a decoded JSON value (maps with sorted keys)."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_value(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(_go_value(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def strict_error(content_type: str, body: bytes, patched: dict[str, Any], unknown: list[str]) -> APIError:
    """The API server's 422 for a patch that leaves unknown fields under ``fieldValidation=Strict``.

    It names the patch (a strategic merge patch, as Go prints its map) or the patched object
    (JSON; the API server's field order is approximated).
    """
    if content_type.split(";", maxsplit=1)[0].strip() == STRATEGIC:
        shown = _go_value(json.loads(body or b"null"))
    else:
        shown = json.dumps(patched, separators=(",", ":"))
    fields = ", ".join(f'unknown field "{path}"' for path in unknown)
    cause = f"Invalid value: {json.dumps(shown)}: strict decoding error: {fields}"
    details = {"causes": [{"reason": "FieldValueInvalid", "message": cause, "field": "patch"}]}
    return APIError(422, "Invalid", f' "" is invalid: patch: {cause}', details)
