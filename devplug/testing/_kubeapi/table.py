"""Server-side printing: ``meta.k8s.io/v1`` Tables, which ``kubectl get`` asks for.

A GET or list whose ``Accept`` names ``application/json;as=Table;g=meta.k8s.io;v=v1`` is answered
with a Table of the columns the API server prints for the kind (``-o wide`` shows those of
priority 1). Each row carries the object as ``includeObject`` says: ``Metadata`` (the default, a
``PartialObjectMetadata``), ``Object`` or ``None``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from devplug.testing._kubeapi.status import bad_request

Cells = Callable[[dict[str, Any], datetime.datetime], list[Any]]


def wants_table(accept: str) -> bool:
    """Whether the ``Accept`` header asks for a meta.k8s.io/v1 Table (before any other type)."""
    for entry in accept.split(","):
        media, *params = (p.strip() for p in entry.split(";"))
        options = dict(p.split("=", 1) for p in params if "=" in p)
        if options.get("as") == "Table" and options.get("g") == "meta.k8s.io" and options.get("v") == "v1":
            return media in ("application/json", "*/*")
        if "as" not in options and media in ("application/json", "*/*"):
            return False
    return False


def human_duration(seconds: float) -> str:  # noqa: PLR0911  (one answer per range, as upstream)
    """A duration as kubectl prints ages (apimachinery's ``duration.HumanDuration``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age(obj: dict[str, Any], now: datetime.datetime) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    created = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    return human_duration((now - created).total_seconds())


def _column(name: str, description: str, *, format_: str = "", priority: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "format": format_,
        "description": description,
        "priority": priority,
    }


_NAME = _column("Name", "The object's name.", format_="name")
_AGE = _column("Age", "Time since the object was created.")


def _slice_cells(obj: dict[str, Any], now: datetime.datetime) -> list[Any]:
    spec = obj.get("spec") or {}
    return [
        obj["metadata"]["name"],
        spec.get("nodeName", ""),
        spec.get("driver", ""),
        (spec.get("pool") or {}).get("name", ""),
        _age(obj, now),
    ]


def _claim_state(obj: dict[str, Any]) -> str:
    meta, status = obj["metadata"], obj.get("status") or {}
    states = ["deleted"] if meta.get("deletionTimestamp") else []
    if not status.get("allocation"):
        if not meta.get("deletionTimestamp"):
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
        elif meta.get("deletionTimestamp"):
            states.append("deallocating")
    return ",".join(states)


def _claim_cells(obj: dict[str, Any], now: datetime.datetime) -> list[Any]:
    return [obj["metadata"]["name"], _claim_state(obj), _age(obj, now)]


def _node_status(obj: dict[str, Any]) -> str:
    conditions = {c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready")
    states = ["Ready" if ready == "True" else "NotReady" if ready is not None else "Unknown"]
    if (obj.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    return ",".join(states)


def _node_roles(obj: dict[str, Any]) -> str:
    roles = set()
    for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/"):
            role = key.removeprefix("node-role.kubernetes.io/")
            if role:
                roles.add(role)
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return ",".join(sorted(roles)) or "<none>"


def _address(obj: dict[str, Any], kind: str) -> str:
    for address in (obj.get("status") or {}).get("addresses") or []:
        if address.get("type") == kind:
            return str(address.get("address", ""))
    return "<none>"


def _node_cells(obj: dict[str, Any], now: datetime.datetime) -> list[Any]:
    info = (obj.get("status") or {}).get("nodeInfo") or {}
    kernel = info.get("kernelVersion") or "<unknown>"
    if info.get("architecture"):
        kernel += f" ({info['architecture']})"
    return [
        obj["metadata"]["name"],
        _node_status(obj),
        _node_roles(obj),
        _age(obj, now),
        info.get("kubeletVersion", ""),
        _address(obj, "InternalIP"),
        _address(obj, "ExternalIP"),
        info.get("osImage") or "<unknown>",
        kernel,
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


_TABLES: dict[str, tuple[list[dict[str, Any]], Cells]] = {
    "resourceslices": (
        [
            _NAME,
            _column("Node", "The node that provides the pool's devices."),
            _column("Driver", "The DRA driver that publishes the slice."),
            _column("Pool", "The name of the pool."),
            _AGE,
        ],
        _slice_cells,
    ),
    "resourceclaims": (
        [_NAME, _column("State", "Whether the claim is pending, allocated, reserved or deleted."), _AGE],
        _claim_cells,
    ),
    "nodes": (
        [
            _NAME,
            _column("Status", "Ready, NotReady or Unknown; SchedulingDisabled when cordoned."),
            _column("Roles", "The node-role labels."),
            _AGE,
            _column("Version", "The kubelet's version."),
            _column("Internal-IP", "The node's internal address.", priority=1),
            _column("External-IP", "The node's external address.", priority=1),
            _column("OS-Image", "The operating system.", priority=1),
            _column("Kernel-Version", "The kernel's version.", priority=1),
            _column("Container-Runtime", "The container runtime and its version.", priority=1),
        ],
        _node_cells,
    ),
}


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "Object":
        return obj
    if include == "None":
        return None
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(
    plural: str, objects: list[dict[str, Any]], list_meta: dict[str, Any], query: dict[str, str]
) -> dict[str, Any]:
    """The Table of ``objects`` (one GET: a list of one, ``list_meta`` from the object)."""
    include = query.get("includeObject") or "Metadata"
    if include not in ("Metadata", "Object", "None"):
        raise bad_request(
            f'includeObject: Unsupported value: "{include}": supported values: "Metadata", "None", "Object"'
        )
    columns, cells = _TABLES[plural]
    now = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for obj in objects:
        rows.append({"cells": cells(obj, now), "object": _row_object(obj, include)})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns,
        "rows": rows,
    }
