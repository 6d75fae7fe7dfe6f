"""Strategic merge patch, driven by the patch strategies of the kind's OpenAPI schema.

As ``k8s.io/apimachinery/pkg/util/strategicpatch`` applies one: maps merge key by key (``null``
removes); a list whose schema says ``x-kubernetes-patch-strategy: merge`` merges with the
current list, by ``x-kubernetes-patch-merge-key`` for lists of objects (an item with
``$patch: delete`` removes the one with its key) or by value for lists of scalars; other lists
are replaced whole. The directives kubectl sends are understood: ``$patch`` (``replace``,
``delete``), ``$retainKeys``, ``$setElementOrder/<field>`` and ``$deleteFromPrimitiveList/<field>``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from devplug.testing._kubeapi.openapi import documents

Schema = dict[str, Any]
_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"
_DELETE = object()  # a map that ``$patch: delete`` removes


@functools.cache
def _schemas(document: str) -> dict[str, Schema]:
    schemas: dict[str, Schema] = documents()[document]["components"]["schemas"]
    return schemas


def kind_schema(document: str, group: str, kind: str) -> tuple[str, Schema] | None:
    """The schema of ``kind`` in the group-version ``document`` (``api/v1``, ``apis/<group>/v1``)."""
    for schema in _schemas(document).values():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            if gvk.get("group") == group and gvk.get("kind") == kind and gvk.get("version") == "v1":
                return document, schema
    return None


def _resolve(document: str, schema: Schema | None) -> Schema:
    while schema:
        ref = schema.get("$ref")
        if ref is None and len(schema.get("allOf", [])) == 1:
            ref = schema["allOf"][0].get("$ref")
        if ref is None:
            return schema
        schema = _schemas(document).get(ref.rsplit("/", 1)[-1])
    return {}


def _field(schema: Schema, key: str) -> Schema:
    """The schema of ``key`` in an object's schema (with its patch extensions), or {}."""
    properties = schema.get("properties") or {}
    if key in properties:
        return dict(properties[key])
    extra = schema.get("additionalProperties")
    return dict(extra) if isinstance(extra, dict) else {}


def _clean(value: Any) -> Any:
    """A value set whole: without directives (a replaced list or a new map)."""
    if isinstance(value, dict):
        return {
            k: _clean(v)
            for k, v in value.items()
            if k not in ("$patch", "$retainKeys") and not k.startswith((_ORDER, _DELETE_FROM))
        }
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return copy.deepcopy(value)


def merge(document: str, target: Any, patch: Any, schema: Schema) -> Any:
    """``target`` with the strategic merge ``patch`` applied (``schema``: the object's)."""
    result = _merge_map(document, target if isinstance(target, dict) else {}, patch, schema)
    return {} if result is _DELETE else result


def _merge_map(document: str, target: dict[str, Any], patch: dict[str, Any], schema: Schema) -> Any:
    schema = _resolve(document, schema)
    directive = patch.get("$patch")
    if directive == "replace":
        return _clean(patch)
    if directive == "delete":
        return _DELETE
    result = dict(target)
    orders = {k.removeprefix(_ORDER): v or [] for k, v in patch.items() if k.startswith(_ORDER)}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith(_ORDER):
            continue
        if key.startswith(_DELETE_FROM):
            name = key.removeprefix(_DELETE_FROM)
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in (value or [])]
            continue
        _merge_field(document, result, key, value, _field(schema, key), order=orders.get(key))
    for name, order in orders.items():  # a list only reordered (or only shortened) by the patch
        if name not in patch and isinstance(result.get(name), list):
            result[name] = _merge_list(document, result[name], [], _field(schema, name), order)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_field(
    document: str, result: dict[str, Any], key: str, value: Any, schema: Schema, *, order: list[Any] | None
) -> None:
    """Set ``result[key]`` from the patch's ``value`` (``schema``: the field's)."""
    current = result.get(key)
    strategy = str(schema.get("x-kubernetes-patch-strategy", "")).split(",")
    if value is None:
        result.pop(key, None)
    elif isinstance(value, dict):
        merged = _merge_map(document, current if isinstance(current, dict) else {}, value, schema)
        if merged is _DELETE:
            result.pop(key, None)
        else:
            result[key] = merged
    elif isinstance(value, list) and "merge" in strategy:
        target = current if isinstance(current, list) else []
        result[key] = _merge_list(document, target, value, schema, order)
    else:
        result[key] = _clean(value)


def _merge_list(
    document: str, target: list[Any], patch: list[Any], schema: Schema, order: list[Any] | None
) -> list[Any]:
    """A merging list: items merged by key (or value), then ordered as the API server orders them."""
    key = schema.get("x-kubernetes-patch-merge-key")
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [_clean(item) for item in patch if not (isinstance(item, dict) and item.get("$patch"))]

    def ident(item: Any) -> Any:
        return item.get(key) if key and isinstance(item, dict) else item

    items_schema = schema.get("items") or {}
    merged = [copy.deepcopy(item) for item in target]
    patched: list[Any] = []
    for item in patch:
        if key and not isinstance(item, dict):
            continue
        at = next((i for i, old in enumerate(merged) if ident(old) == ident(item)), None)
        if isinstance(item, dict) and item.get("$patch") == "delete":
            merged = [old for old in merged if ident(old) != ident(item)]
            continue
        if at is None:
            merged.append(_clean(item))
        elif key:
            merged[at] = _merge_map(document, merged[at], item, items_schema)
        patched.append(ident(item))
    wanted = [ident(entry) for entry in order] if order is not None else patched
    right = [item for want in wanted for item in merged if ident(item) == want]
    left = [item for item in merged if ident(item) not in wanted]
    return _merge_sorted(left, right, [ident(item) for item in target], ident)


def _merge_sorted(left: list[Any], right: list[Any], server: list[Any], ident: Any) -> list[Any]:
    """The items the patch did not name (``left``, in the stored order) placed among the patch's
    (``right``, in its order): one goes first only when both were stored and it came first."""
    result: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right):
            result.append(left[i])
            i += 1
            continue
        if i < len(left):
            li, ri = ident(left[i]), ident(right[j])
            if li in server and ri in server and server.index(li) < server.index(ri):
                result.append(left[i])
                i += 1
                continue
        result.append(right[j])
        j += 1
    return result
