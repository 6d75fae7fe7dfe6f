"""From HTTP requests to store operations: paths, verbs, query parameters and answers.

Paths are ``/api/v1/<plural>[/<name>[/status]]`` for the core group and
``/apis/<group>/v1[/namespaces/<ns>]/<plural>[/<name>[/status]]`` for the others; the verb is
the Kubernetes one (get, list, watch, create, update, patch, delete, deletecollection), as RBAC
and audit logs name it.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from devplug.testing._kubeapi.httpserver import Request, Response, StreamResponse
from devplug.testing._kubeapi.resources import KINDS, Kind, field_selector, label_selector
from devplug.testing._kubeapi.status import APIError, bad_request
from devplug.testing._kubeapi.table import table, wants_table
from devplug.testing._kubeapi.watch import list_objects, parse_rv, watch

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from devplug.testing._kubeapi.resources import Selector
    from devplug.testing._kubeapi.store import Store

_NOT_FOUND = "the server could not find the requested resource"
_COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
_ITEM_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_FIELD_VALIDATION = {"": "Warn", "Warn": "Warn", "Ignore": "Ignore", "Strict": "Strict"}


@dataclass(frozen=True)
class Route:
    """What a request is about; ``namespace`` is None for cluster-scoped kinds and all-namespace lists."""

    kind: Kind
    namespace: str | None
    name: str
    subresource: str
    verb: str


def not_found_path() -> APIError:
    return APIError(404, "NotFound", _NOT_FOUND, {})


def _not_allowed(method: str, kind: Kind) -> APIError:
    message = f"{method} is not supported on resources of kind {kind.names.resource!r}".replace("'", '"')
    return APIError(405, "MethodNotAllowed", message, kind.names.details())


def route(request: Request) -> Route | None:
    """The route of a resource path (None for other paths); 404 or 405 when it cannot be served."""
    path = request.path.rstrip("/")
    for kind in KINDS.values():
        if path == kind.prefix or not path.startswith(kind.prefix + "/"):
            continue
        parts = path[len(kind.prefix) + 1 :].split("/")
        namespace: str | None = None
        if parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        if parts[0] != kind.plural:
            continue
        if (namespace is not None) != kind.namespaced and not (namespace is None and len(parts) == 1):
            raise not_found_path()
        name = parts[1] if len(parts) > 1 else ""
        subresource = parts[2] if len(parts) > 2 else ""
        if len(parts) > 3 or (subresource and (subresource != "status" or not kind.status)):
            raise not_found_path()
        verbs = _ITEM_VERBS if name else _COLLECTION_VERBS
        verb = verbs.get(request.method)
        if verb is None or (subresource and verb not in ("get", "update", "patch")):
            raise _not_allowed(request.method, kind)
        if kind.namespaced and namespace is None and verb != "list":
            raise _not_allowed(request.method, kind)
        if verb in ("list", "get") and request.query.get("watch", "").lower() in ("true", "1"):
            verb = "watch"
        return Route(kind, namespace, name, subresource, verb)
    return None


def json_response(status: int, obj: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, json.dumps(obj, separators=(",", ":")).encode(), headers=headers or [])


def error_response(error: APIError) -> Response:
    return json_response(error.code, error.status(), error.headers)


def _warnings(texts: list[str]) -> list[tuple[str, str]]:
    return [("Warning", f"299 - {json.dumps(t)}") for t in texts]


def _body(request: Request, kind: Kind) -> Any:
    try:
        return json.loads(request.body or b"null")
    except ValueError as exc:
        raise bad_request(
            f'{kind.names.kind} in version "v1" cannot be handled as a {kind.names.kind}: {exc}'
        ) from exc


async def dispatch(
    store: Store, request: Request, r: Route, *, bookmark_interval: float
) -> Response | StreamResponse:
    """Carry out a routed request against ``store``."""
    q = request.query
    dry_run = "dryRun" in q
    if dry_run and q["dryRun"] != "All":
        raise bad_request(f'Invalid dryRun value: "{q["dryRun"]}"; supported values are: "All"')
    if r.verb == "get":
        obj = store.get(r.kind, r.namespace or "", r.name)
        if wants_table(request.headers.get("accept", "")):
            rv = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return json_response(200, table(r.kind.plural, [obj], rv, q))
        return json_response(200, obj)
    if r.verb in ("list", "deletecollection", "watch"):
        return _collection(
            store,
            r,
            q,
            dry_run=dry_run,
            bookmark_interval=bookmark_interval,
            tables=wants_table(request.headers.get("accept", "")),
        )
    if r.verb == "delete":
        options = _body(request, r.kind) if request.body.strip() else {}
        if not isinstance(options, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        return json_response(200, store.delete(r.kind, r.namespace or "", r.name, options, dry_run=dry_run))
    return _write(store, request, r, dry_run=dry_run)


def _write(store: Store, request: Request, r: Route, *, dry_run: bool) -> Response:
    """create, update, patch: the answer carries a Warning header for each dropped unknown field."""
    mode = _FIELD_VALIDATION.get(request.query.get("fieldValidation", ""))
    if mode is None:
        raise bad_request(f"fieldValidation parameter unsupported: {request.query['fieldValidation']}")
    kind, ns, strict = r.kind, r.namespace or "", mode == "Strict"
    if r.verb == "create":
        obj, warnings = store.create(kind, ns, _body(request, kind), strict=strict, dry_run=dry_run)
    elif r.verb == "update":
        obj, warnings = store.update(
            kind, ns, r.name, _body(request, kind), subresource=r.subresource, strict=strict, dry_run=dry_run
        )
    else:
        content_type = request.headers.get("content-type", "")
        obj, warnings = store.patch(
            kind,
            ns,
            r.name,
            content_type,
            request.body,
            subresource=r.subresource,
            strict=strict,
            dry_run=dry_run,
        )
    return json_response(
        201 if r.verb == "create" else 200, obj, _warnings(warnings if mode == "Warn" else [])
    )


def _collection(
    store: Store, r: Route, q: dict[str, str], *, dry_run: bool, bookmark_interval: float, tables: bool
) -> Response | StreamResponse:
    """list, watch, deletecollection: the objects the selectors choose."""
    select_fields = field_selector(r.kind, q.get("fieldSelector"))
    select_labels = label_selector(q.get("labelSelector"))
    if r.name:  # a watch on one object's path
        select_fields = field_selector(r.kind, f"metadata.name={r.name}")

    def select(obj: dict[str, Any]) -> bool:
        return select_fields(obj) and select_labels(obj)

    if r.verb == "watch":
        return _watch(store, r, select, q, bookmark_interval=bookmark_interval, tables=tables)
    if r.verb == "list":
        if q.get("resourceVersion"):
            parse_rv(q["resourceVersion"], for_watch=False)
        limit = _int(q.get("limit") or "0", "limit")
        found = list_objects(store, r.kind, r.namespace, select, limit=limit, token=q.get("continue"))
        if tables:
            return json_response(200, table(r.kind.plural, found["items"], found["metadata"], q))
        return json_response(200, found)
    # DeleteCollection answers the list of what it deleted, as listed before.
    found = list_objects(store, r.kind, r.namespace, select)
    if not dry_run:
        for obj in found["items"]:
            with contextlib.suppress(APIError):  # gone meanwhile
                store.delete(r.kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
    return json_response(200, found)


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad_request(f'{name}: Invalid value: "{text}": must be an integer') from None


def _watch(
    store: Store, r: Route, select: Selector, q: dict[str, str], *, bookmark_interval: float, tables: bool
) -> StreamResponse:
    rv = q.get("resourceVersion")
    if rv not in (None, "", "0"):
        parse_rv(rv)
    timeout = q.get("timeoutSeconds")
    deadline = anyio.current_time() + _int(timeout, "timeoutSeconds") if timeout else None
    events = watch(
        store,
        r.kind,
        r.namespace,
        select,
        rv,
        send_initial=q.get("sendInitialEvents", "").lower() == "true",
        bookmarks=q.get("allowWatchBookmarks", "").lower() in ("true", "1"),
        bookmark_interval=bookmark_interval,
        deadline=deadline,
    )
    return StreamResponse(_lines(events, r.kind.plural, q if tables else None))


async def _lines(
    events: AsyncIterator[tuple[str, dict[str, Any]]], plural: str, tables: dict[str, str] | None
) -> AsyncGenerator[bytes, None]:
    """Newline-delimited watch events; an error (410 Expired) becomes an ERROR event, and the end.

    With ``tables`` (the query), each object but a bookmark is sent as a Table of one row; only
    the first names the columns (later ones: ``columnDefinitions`` null, as the API server sends).
    """
    first = True
    try:
        async for type_, obj in events:
            if tables is not None and type_ != "BOOKMARK":
                rv = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
                sent = table(plural, [obj], rv, tables)
                if not first:
                    sent["columnDefinitions"] = None
                first = False
            else:
                sent = obj
            yield json.dumps({"type": type_, "object": sent}, separators=(",", ":")).encode() + b"\n"
    except APIError as exc:
        yield json.dumps({"type": "ERROR", "object": exc.status()}, separators=(",", ":")).encode() + b"\n"
    finally:
        await events.aclose()  # type: ignore[attr-defined]
