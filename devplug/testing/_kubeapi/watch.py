"""Lists and watches over the store, with the API server's semantics.

A list answers the current state with the current resourceVersion; ``limit`` and ``continue``
page through it in (namespace, name) order (a continued list reads the state of its own time,
not a snapshot of the first page's). A watch from resourceVersion "0", "" or none first sends
every matching object as ADDED; from a given resourceVersion it replays the history after it,
or fails with 410 Expired when the history no longer reaches back that far. Under a selector an
object that starts to match arrives as ADDED and one that stops matching as DELETED, as from
the watch cache.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import copy
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio

from devplug.testing._kubeapi.status import APIError, bad_request

if TYPE_CHECKING:
    from devplug.testing._kubeapi.resources import Kind
    from devplug.testing._kubeapi.store import Store

Selector = Callable[[dict[str, Any]], bool]


def gone(rv: int, oldest: int) -> APIError:
    return APIError(410, "Expired", f"too old resource version: {rv} ({oldest})")


def list_objects(
    store: Store,
    kind: Kind,
    namespace: str | None,
    select: Selector,
    *,
    limit: int = 0,
    token: str | None = None,
) -> dict[str, Any]:
    """The ``<Kind>List`` answer; items carry no kind or apiVersion, as from a real server."""
    start = _decode_continue(token) if token else None
    items = []
    for obj in store.items(kind, namespace):
        key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
        if start is not None and key <= start:
            continue
        if select(obj):
            obj.pop("kind", None)
            obj.pop("apiVersion", None)
            items.append((key, obj))
    meta: dict[str, Any] = {"resourceVersion": str(store.rv)}
    if 0 < limit < len(items):
        meta["continue"] = _encode_continue(items[limit - 1][0], store.rv)
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    return {
        "kind": f"{kind.names.kind}List",
        "apiVersion": kind.api_version,
        "metadata": meta,
        "items": [obj for _, obj in items],
    }


def _encode_continue(key: str, rv: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": key + "\x00"}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        start = json.loads(raw)["start"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from exc
    if not isinstance(start, str):
        raise bad_request("continue key is not valid: no start key")
    return start.rstrip("\x00")


def parse_rv(text: str, *, for_watch: bool = True) -> int:
    """A resourceVersion as the API server parses it (an unsigned decimal integer).

    Refused with the real server's texts: a list answers 400 BadRequest; a watch answers 500 with
    no reason (the error reaches the handler unwrapped, as kube-apiserver 1.37.2 answers it).
    """
    if text.isascii() and text.isdigit():
        return int(text)
    parsing = f"strconv.ParseUint: parsing {json.dumps(text)}: invalid syntax"
    why = f'resourceVersion: Invalid value: "{text}": {parsing}'
    if for_watch:
        raise APIError(500, "", why)
    raise bad_request(f"invalid resource version: {why}")


async def watch(
    store: Store,
    kind: Kind,
    namespace: str | None,
    select: Selector,
    resource_version: str | None,
    *,
    send_initial: bool = False,
    bookmarks: bool = False,
    bookmark_interval: float = 60.0,
    deadline: float | None = None,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Yield ``(type, object)`` until cancelled; raises 410 (Expired) for a compacted resourceVersion.

    With ``bookmarks`` (``allowWatchBookmarks``), a BOOKMARK carrying the resourceVersion seen
    so far comes after ``bookmark_interval`` seconds without events, and after the initial
    events of ``send_initial`` (``sendInitialEvents=true``), annotated as their end. At
    ``deadline`` (``anyio.current_time()``, from ``timeoutSeconds``) the watch ends.
    """
    if resource_version in (None, "", "0") or send_initial:
        position = store.rv
        for obj in store.items(kind, namespace):
            if select(obj):
                yield "ADDED", obj
        if send_initial and bookmarks:
            yield "BOOKMARK", bookmark(kind, position, initial_end=True)
    else:
        position = parse_rv(resource_version)
    while True:
        position, events = _since(store, kind, namespace, select, position)
        for event in events:
            yield event
        if store.events and store.events[-1].rv > position:
            continue  # written while the last events were being sent
        # No cancel scope may stay open across a yield of this generator: the wait alone is timed.
        wait = bookmark_interval if bookmarks else math.inf
        if deadline is not None:
            wait = min(wait, deadline - anyio.current_time())
            if wait <= 0:
                return  # timeoutSeconds: the server ends the watch
        with anyio.move_on_after(wait) as waited:
            await store.changed()
        if waited.cancelled_caught and bookmarks and (deadline is None or anyio.current_time() < deadline):
            yield "BOOKMARK", bookmark(kind, position)


def _since(
    store: Store, kind: Kind, namespace: str | None, select: Selector, position: int
) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
    """The events after ``position`` (as this watch sees them) and the position after them."""
    if position < store.compacted:  # too old, or the watcher fell behind the history
        raise gone(position, store.compacted + 1)
    history = list(store.events)
    out = []
    for event in history[bisect.bisect_right([e.rv for e in history], position) :]:
        position = event.rv
        if event.resource != kind.plural:
            continue
        if namespace is not None and event.obj["metadata"].get("namespace") != namespace:
            continue
        translated = _translate(event.type, event.obj, event.old, event.rv, select)
        if translated is not None:
            out.append(translated)
    return position, out


def bookmark(kind: Kind, rv: int, *, initial_end: bool = False) -> dict[str, Any]:
    """A BOOKMARK event's object: the kind with only a resourceVersion (and the initial-events mark)."""
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": kind.names.kind, "apiVersion": kind.api_version, "metadata": meta}


def _translate(
    type_: str, obj: dict[str, Any], old: dict[str, Any] | None, rv: int, select: Selector
) -> tuple[str, dict[str, Any]] | None:
    now_in = select(obj) if type_ != "DELETED" else False
    was_in = old is not None and select(old)
    if type_ == "DELETED":
        return ("DELETED", copy.deepcopy(obj)) if was_in else None
    if now_in and was_in:
        return "MODIFIED", copy.deepcopy(obj)
    if now_in:
        return "ADDED", copy.deepcopy(obj)
    if was_in and old is not None:
        # Left the selection: the old state, at the new resourceVersion.
        left = copy.deepcopy(old)
        left["metadata"]["resourceVersion"] = str(rv)
        return "DELETED", left
    return None
