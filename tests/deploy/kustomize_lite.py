"""The part of Kustomize that deploy/ uses, in pure Python, so the tests render it without a binary.

Supported: a ``kustomization.yaml`` (kind Kustomization) with ``resources`` (YAML files, or
directories holding a kustomization) and ``patches`` whose file is an RFC 6902 JSON patch (a
YAML list of operations) applied to the objects its ``target`` names by kind and name. The
operations are add, remove, replace and test, as Kustomize applies them.

Anything else (other kustomization fields, strategic-merge patches, components, generators,
remote resources) raises :class:`UnsupportedError`: a manifest change this renderer cannot
follow fails the tests instead of being rendered wrongly. Where ``kubectl`` is installed, the
tests also compare this renderer's output with ``kubectl kustomize``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PatchError", "UnsupportedError", "apply_json_patch", "object_id", "render"]

KUSTOMIZATION = "kustomization.yaml"
_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches"})
_PATCH_FIELDS = frozenset({"path", "target"})
_TARGET_FIELDS = frozenset({"kind", "name"})
_OPERATIONS = frozenset({"add", "remove", "replace", "test"})


class UnsupportedError(Exception):
    """The kustomization uses something this renderer does not implement."""


class PatchError(Exception):
    """A JSON patch operation does not apply (a missing path, or a failed test)."""


def object_id(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): what Kustomize keeps unique."""
    meta = obj.get("metadata") or {}
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object the kustomization in ``directory`` produces, patches applied.

    Raises:
        UnsupportedError: the kustomization uses a feature not implemented here.
        PatchError: a patch does not apply.
        ValueError: two objects with the same identity.
    """
    data = yaml.safe_load((directory / KUSTOMIZATION).read_text()) or {}
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise UnsupportedError(f"{directory / KUSTOMIZATION}: unsupported fields {unknown}")
    if data.get("kind", "Kustomization") != "Kustomization":
        raise UnsupportedError(f"{directory / KUSTOMIZATION}: kind {data['kind']} is not supported")
    objects: list[dict[str, Any]] = []
    for entry in data.get("resources", []):
        if "://" in entry:
            raise UnsupportedError(f"{directory / KUSTOMIZATION}: remote resource {entry}")
        path = Path(os.path.normpath(directory / entry))
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        key = object_id(obj)
        if key in seen:
            raise ValueError(f"{directory}: {key} is defined twice")
        seen.add(key)
    for patch in data.get("patches", []):
        objects = _patched(directory, patch, objects)
    return objects


def _patched(directory: Path, patch: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    where = f"{directory / KUSTOMIZATION}: patch {patch.get('path')!r}"
    if set(patch) - _PATCH_FIELDS or "path" not in patch:
        raise UnsupportedError(f"{where}: only 'path' and 'target' are supported")
    target = patch.get("target") or {}
    if not target or set(target) - _TARGET_FIELDS:
        raise UnsupportedError(f"{where}: the target must name a kind and/or a name, nothing else")
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    if not isinstance(operations, list):
        raise UnsupportedError(f"{where}: only JSON patches (a list of operations) are supported")
    out = []
    matched = 0
    for obj in objects:
        if not all(
            (obj["kind"] if field == "kind" else obj["metadata"]["name"]) == value
            for field, value in target.items()
        ):
            out.append(obj)
            continue
        matched += 1
        try:
            out.append(apply_json_patch(obj, operations))
        except PatchError as exc:
            raise PatchError(f"{where} on {object_id(obj)}: {exc}") from None
    if not matched:
        raise PatchError(f"{where}: the target {target} matches no object")
    return out


def apply_json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """``document`` with the RFC 6902 ``operations`` applied (add, remove, replace, test).

    Raises:
        UnsupportedError: another operation (move, copy) or a patch of the whole document.
        PatchError: an operation does not apply.
    """
    doc = copy.deepcopy(document)
    for operation in operations:
        op = operation.get("op")
        if op not in _OPERATIONS:
            raise UnsupportedError(f"JSON patch operation {op!r} is not supported")
        tokens = _tokens(operation["path"])
        parent = _walk(doc, tokens[:-1], operation["path"])
        key = tokens[-1]
        if op == "add":
            _add(parent, key, copy.deepcopy(operation["value"]), operation["path"])
            continue
        index = _existing(parent, key, operation["path"])
        if op == "remove":
            del parent[index]
        elif op == "replace":
            parent[index] = copy.deepcopy(operation["value"])
        elif parent[index] != operation["value"]:
            raise PatchError(
                f"test of {operation['path']} failed: {parent[index]!r} != {operation['value']!r}"
            )
    return doc


def _tokens(path: str) -> list[str]:
    if not path.startswith("/"):
        raise UnsupportedError(f"JSON pointer {path!r}: only non-empty absolute pointers are supported")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _walk(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens:
        node = node[_existing(node, token, path)]
    return node


def _existing(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchError(f"{path}: no member {token!r}")
        return token
    if isinstance(node, list):
        if not token.isdigit() or int(token) >= len(node):
            raise PatchError(f"{path}: no element {token!r} in a list of {len(node)}")
        return int(token)
    raise PatchError(f"{path}: {token!r} is inside a scalar")


def _add(parent: Any, token: str, value: Any, path: str) -> None:
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        if token == "-":  # noqa: S105 - the JSON pointer for "after the last element"
            parent.append(value)
        elif token.isdigit() and int(token) <= len(parent):
            parent.insert(int(token), value)
        else:
            raise PatchError(f"{path}: cannot add at {token!r} in a list of {len(parent)}")
    else:
        raise PatchError(f"{path}: cannot add inside a scalar")
