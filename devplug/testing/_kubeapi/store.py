"""The fake API server's storage: objects as JSON dicts, one resourceVersion counter, write rules.

Create, update, patch and delete follow ``k8s.io/apiserver``'s generic registry: decoding (400),
preconditions and optimistic locking (409), the kind's strategy (generation, what a status
update may change, fields a default server drops) and validation (422). Every write gets the
next resourceVersion and is recorded in a bounded event history that watches read from.
"""

from __future__ import annotations

import copy
import datetime
import random
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

from devplug._versioned import Versioned
from devplug.testing._kubeapi.patch import apply as apply_patch
from devplug.testing._kubeapi.patch import check_type, strict_error
from devplug.testing._kubeapi.schema import decode
from devplug.testing._kubeapi.status import (
    OPTIMISTIC_LOCK,
    APIError,
    already_exists,
    bad_request,
    conflict,
    not_found,
)
from devplug.testing._kubeapi.strategic import kind_schema
from devplug.testing._kubeapi.strategy import Gates, decode_body, prepare_create, prepare_update, validate

if TYPE_CHECKING:
    from devplug.testing._kubeapi.resources import Kind

# The API server's generateName suffix: 5 characters without vowels or look-alikes.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATE_PREFIX = 63 - 5


class Event(NamedTuple):
    """One write, as the watch history keeps it."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(namespace: str, name: str) -> tuple[str, str]:
    return (namespace, name)


class Store:
    """Objects by resource and (namespace, name); writes numbered by one resourceVersion counter."""

    def __init__(self, kinds: dict[str, Kind], *, history: int, gates: Gates) -> None:
        self.kinds = kinds
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in kinds}
        self.rv = 1
        self.history = history
        self.events: deque[Event] = deque()
        self.compacted = self.rv  # watches may start at this resourceVersion or later
        self.gates = gates
        self._changes = Versioned(None)

    # -- notification ----------------------------------------------------------------------------

    async def changed(self) -> None:
        """Return after the next write (or :meth:`poke`)."""
        await self._changes.newer_than(self._changes.version)

    def poke(self) -> None:
        """Wake every :meth:`changed` waiter."""
        self._changes.bump()

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older resourceVersions are gone."""
        self.events.clear()
        self.compacted = self.rv
        self.poke()

    def _commit(
        self, type_: str, kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = _key(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if type_ == "DELETED":
            self.objects[kind.plural].pop(key, None)
        else:
            self.objects[kind.plural][key] = obj
        self.events.append(Event(self.rv, type_, kind.plural, copy.deepcopy(obj), old))
        while len(self.events) > self.history:
            self.compacted = self.events.popleft().rv
        self.poke()
        return copy.deepcopy(obj)

    # -- reads -----------------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects[kind.plural].get(_key(namespace, name))
        if obj is None:
            raise not_found(kind.names, name)
        return copy.deepcopy(obj)

    def items(self, kind: Kind, namespace: str | None = None) -> list[dict[str, Any]]:
        """Current objects (copies), in (namespace, name) order; ``namespace`` None: all."""
        found = self.objects[kind.plural]
        return [copy.deepcopy(found[k]) for k in sorted(found) if namespace is None or k[0] == namespace]

    # -- writes ----------------------------------------------------------------------------------

    def create(
        self,
        kind: Kind,
        namespace: str,
        body: Any,
        *,
        strict: bool = False,
        dry_run: bool = False,
        uid: str | None = None,
    ) -> tuple[dict[str, Any], list[str]]:
        """POST: the created object and the warnings (unknown fields dropped); ``uid`` for test helpers."""
        warnings = decode_body(kind, body, strict=strict)
        meta = body["metadata"]
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for server_owned in ("uid", "creationTimestamp", "deletionTimestamp", "generation", "selfLink"):
            meta.pop(server_owned, None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(kind, namespace, meta["generateName"])
        prepare_create(kind, body, self.gates)
        validate(kind, body, None, "")
        if _key(meta.get("namespace", ""), meta["name"]) in self.objects[kind.plural]:
            raise already_exists(kind.names, meta["name"])
        if meta.get("resourceVersion"):
            why = "resourceVersion should not be set on objects to be created"
            raise APIError(
                500, "InternalError", f"Internal error occurred: {why}", {"causes": [{"message": why}]}
            )
        meta["uid"] = uid or str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if kind.tracks_generation:
            meta["generation"] = 1
        if dry_run:
            return body, warnings
        return self._commit("ADDED", kind, body, None), warnings

    def _generate_name(self, kind: Kind, namespace: str, prefix: str) -> str:
        prefix = prefix[:_MAX_GENERATE_PREFIX]
        while True:  # the API server retries a taken name too
            name = prefix + "".join(random.choices(_SUFFIX_ALPHABET, k=5))  # noqa: S311 - not a secret
            if _key(namespace, name) not in self.objects[kind.plural]:
                return name

    def update(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        strict: bool = False,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        """PUT: the stored object and the warnings."""
        warnings = decode_body(kind, body, strict=strict)
        meta = body["metadata"]
        if meta.get("name", "") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        if kind.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request(
                f"the namespace of the object ({meta['namespace']}) does not match the namespace on the "
                f"request ({namespace})"
            )
        old = self.get(kind, namespace, name)
        old_meta = old["metadata"]
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            why = f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {old_meta['uid']}"  # noqa: E501
            raise conflict(kind.names, name, why)
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise conflict(kind.names, name, OPTIMISTIC_LOCK)
        new = prepare_update(kind, body, old, subresource, self.gates)
        validate(kind, new, old, subresource)
        if _same(new, old):  # a no-op write keeps the resourceVersion and sends no event
            return old, warnings
        if dry_run:
            return new, warnings
        return self._commit("MODIFIED", kind, new, old), warnings

    def patch(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        *,
        subresource: str = "",
        strict: bool = False,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        """PATCH: applied to the current object, then stored as an update.

        A resourceVersion in the patch is a precondition, as in a PUT.
        """
        check_type(content_type)  # before the lookup: an apply patch would create a missing object
        old = self.get(kind, namespace, name)
        schema = kind_schema(kind.prefix.lstrip("/"), kind.names.group, kind.names.kind)
        patched = apply_patch(old, content_type, body, schema)
        if strict and (unknown := decode(kind.plural, copy.deepcopy(patched)).unknown):
            raise strict_error(content_type, body, patched, unknown)
        return self.update(
            kind, namespace, name, patched, subresource=subresource, strict=strict, dry_run=dry_run
        )

    def delete(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """DELETE: removes at once (finalizers are not honoured) and answers the deleted object or a
        Status, as the kind's registry does."""
        old = self.get(kind, namespace, name)
        pre = (options or {}).get("preconditions") or {}
        meta = old["metadata"]
        # the registry's check before a delete (rest.BeforeDelete), naming the kind, not the resource
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            why = (
                f"the UID in the precondition ({pre['uid']}) does not match the UID in record "
                f"({meta['uid']}). The object might have been deleted and then recreated"
            )
            raise conflict(kind.names, name, why, by_kind=True)
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            why = (
                f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                f"ResourceVersion in record ({meta['resourceVersion']}). The object might have been modified"
            )
            raise conflict(kind.names, name, why, by_kind=True)
        deleted = old if dry_run else self._commit("DELETED", kind, copy.deepcopy(old), old)
        if kind.returns_deleted_object:  # at the deletion's resourceVersion
            return deleted
        details = kind.names.details(name, uid=meta["uid"])
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def write(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as a new version of itself, unchecked (the test helpers' own writes)."""
        old = self.objects[kind.plural].get(
            _key(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        )
        return self._commit("MODIFIED" if old else "ADDED", kind, copy.deepcopy(obj), copy.deepcopy(old))


def _same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return _without_rv(new) == _without_rv(old)


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}
