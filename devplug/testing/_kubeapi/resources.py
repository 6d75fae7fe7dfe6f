"""The kinds the fake API server serves, their field selectors, label selectors and discovery.

Selectors follow ``k8s.io/apimachinery/pkg/fields`` and ``pkg/labels``: a field selector is
``key=value``, ``key==value`` or ``key!=value`` terms joined by commas (all must hold) over the
fields a kind supports (others: 400 ``field label not supported``); a label selector also takes
``key``, ``!key``, ``key in (a,b)`` and ``key notin (a,b)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devplug.testing._kubeapi.status import Names, bad_request

Getter = Callable[[dict[str, Any]], str]


def _get(*path: str) -> Getter:
    def get(obj: dict[str, Any]) -> str:
        value: Any = obj
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


@dataclass(frozen=True)
class Kind:
    """One served resource: where it lives, how it is named, what a field selector may use."""

    names: Names
    namespaced: bool
    status: bool  # has a status subresource
    tracks_generation: bool
    fields: dict[str, Getter]
    short_names: tuple[str, ...] = ()
    # a DELETE answers the deleted object (the registry's ReturnDeletedObject, as resource.k8s.io's
    # kinds have it), else a Status (nodes)
    returns_deleted_object: bool = True

    @property
    def plural(self) -> str:
        return self.names.plural

    @property
    def api_version(self) -> str:
        return f"{self.names.group}/v1" if self.names.group else "v1"

    @property
    def prefix(self) -> str:
        return f"/apis/{self.names.group}/v1" if self.names.group else "/api/v1"


KINDS: dict[str, Kind] = {
    "resourceslices": Kind(
        Names("resource.k8s.io", "resourceslices", "ResourceSlice"),
        namespaced=False,
        status=False,
        tracks_generation=True,
        fields={
            "metadata.name": _get("metadata", "name"),
            "spec.nodeName": _get("spec", "nodeName"),
            "spec.driver": _get("spec", "driver"),
            "spec.pool.name": _get("spec", "pool", "name"),
        },
    ),
    "resourceclaims": Kind(
        Names("resource.k8s.io", "resourceclaims", "ResourceClaim"),
        namespaced=True,
        status=True,
        tracks_generation=True,
        fields={
            "metadata.name": _get("metadata", "name"),
            "metadata.namespace": _get("metadata", "namespace"),
        },
    ),
    "nodes": Kind(
        Names("", "nodes", "Node"),
        namespaced=False,
        status=True,
        tracks_generation=False,
        fields={
            "metadata.name": _get("metadata", "name"),
            "spec.unschedulable": _get("spec", "unschedulable"),
        },
        short_names=("no",),
        returns_deleted_object=False,
    ),
}

Selector = Callable[[dict[str, Any]], bool]


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses, honouring backslash escapes."""
    parts, depth, current, escaped = [], 0, "", False
    for char in text:
        if escaped:
            current += char
            escaped = False
            continue
        if char == "\\":
            current += char
            escaped = True
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def field_selector(kind: Kind, text: str | None) -> Selector:
    """A predicate for ``fieldSelector`` (400 for a field the kind does not support)."""
    terms: list[tuple[Getter, bool, str]] = []
    for term in _split(text or ""):
        match = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", term)
        if match is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key, op, value = match.groups()
        getter = kind.fields.get(key.strip())
        if getter is None:
            gvk = f"{kind.names.group}/v1, Kind={kind.names.kind}"  # the API server's words (core: /v1)
            raise bad_request(f"field label not supported for {gvk}: {key.strip()}")
        terms.append((getter, op != "!=", _unescape(value)))
    return lambda obj: all((get(obj) == value) == equal for get, equal, value in terms)


_LABEL_TERM = re.compile(
    r"(!?)\s*([A-Za-z0-9./_-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*)|\s+(in|notin)\s*\(([^)]*)\))?"
)


def label_selector(text: str | None) -> Selector:
    """A predicate for ``labelSelector`` (equality- and set-based)."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split(text or ""):
        match = _LABEL_TERM.fullmatch(term)
        if match is None:
            raise bad_request(f"unable to parse requirement: {term!r}: invalid label selector")
        negate, key, op, value, set_op, values = match.groups()
        if negate and (op or set_op):
            raise bad_request(f"unable to parse requirement: {term!r}: invalid label selector")
        if set_op is not None:
            op, value = set_op, values
        checks.append(_label_check(key, negate == "!", op, value))

    def select(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return select


def _label_check(
    key: str, negate: bool, op: str | None, value: str | None
) -> Callable[[dict[str, str]], bool]:
    """One requirement: ``op`` is =, ==, !=, in, notin (``value`` the parenthesised list) or None."""
    if op in ("=", "=="):
        return lambda labels: labels.get(key) == value
    if op == "!=":
        return lambda labels: labels.get(key) != value
    if op in ("in", "notin"):
        wanted = {v.strip() for v in (value or "").split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in wanted
        return lambda labels: labels.get(key) not in wanted
    if negate:
        return lambda labels: key not in labels
    return lambda labels: key in labels


# -- discovery -------------------------------------------------------------------------------------

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def resource_list(group: str) -> dict[str, Any]:
    """The APIResourceList of ``/api/v1`` (group "") or ``/apis/<group>/v1``."""
    resources: list[dict[str, Any]] = []
    for kind in KINDS.values():
        if kind.names.group != group:
            continue
        resources.append(
            {
                "name": kind.plural,
                "singularName": kind.names.kind.lower(),
                "namespaced": kind.namespaced,
                "kind": kind.names.kind,
                "verbs": _VERBS,
                **({"shortNames": list(kind.short_names)} if kind.short_names else {}),
            }
        )
        if kind.status:
            resources.append(
                {
                    "name": f"{kind.plural}/status",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": kind.names.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    group_version = f"{group}/v1" if group else "v1"
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def api_group(group: str) -> dict[str, Any]:
    version = {"groupVersion": f"{group}/v1", "version": "v1"}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [version],
        "preferredVersion": version,
    }


def discovery(path: str, kubernetes_version: str) -> dict[str, Any] | None:
    """The answer to a discovery path (``/version``, ``/api``, ``/apis``, ...), or None."""
    groups = sorted({k.names.group for k in KINDS.values() if k.names.group})
    major, minor = kubernetes_version.lstrip("v").split(".")[:2]
    documents: dict[str, Any] = {
        "/version": {
            "major": major,
            "minor": minor,
            "gitVersion": kubernetes_version,
            "platform": "linux/amd64",
        },
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(g) for g in groups]},
        "/api/v1": resource_list(""),
    }
    for group in groups:
        documents[f"/apis/{group}"] = api_group(group)
        documents[f"/apis/{group}/v1"] = resource_list(group)
    return documents.get(path)
