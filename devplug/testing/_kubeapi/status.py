"""API errors of the fake API server: field errors and ``Status`` objects, in the API server's words.

The texts follow ``k8s.io/apimachinery`` (``pkg/api/errors`` and ``pkg/util/validation/field``), so
a driver that matches on messages or reasons sees what a real API server would send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# A field error's value, when it is not shown (Go's ``omitValue``).
OMIT: Any = object()

# field.ErrorType: what the message calls it, and the StatusCause reason it becomes.
_TYPES = {
    "NotFound": ("Not found", "FieldValueNotFound"),
    "Required": ("Required value", "FieldValueRequired"),
    "Duplicate": ("Duplicate value", "FieldValueDuplicate"),
    "Invalid": ("Invalid value", "FieldValueInvalid"),
    "NotSupported": ("Unsupported value", "FieldValueNotSupported"),
    "Forbidden": ("Forbidden", "FieldValueForbidden"),
    "TooLong": ("Too long", "FieldValueTooLong"),
    "TooMany": ("Too many", "FieldValueTooMany"),
    "TypeInvalid": ("Invalid value", "FieldValueTypeInvalid"),
}
# These never show the value (field.Error.ErrorBody).
_VALUELESS = {"Required", "Forbidden", "TooLong"}


def go_value(value: Any) -> str:
    """A value as field errors print it: strings quoted (Go ``%q``), numbers and booleans bare."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One validation error on one field, as ``field.Error``: ``<field>: <type>: <value>: <detail>``."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    @property
    def body(self) -> str:
        """The message without the field path (a StatusCause's ``message``)."""
        text = _TYPES[self.type][0]
        if self.type not in _VALUELESS and self.value is not OMIT:
            text += ": " + go_value(self.value)
        if self.detail:
            text += ": " + self.detail
        return text

    @property
    def reason(self) -> str:
        return _TYPES[self.type][1]

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("Invalid", path, value, detail)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("Required", path, OMIT, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("Forbidden", path, OMIT, detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError("Duplicate", path, value)


def too_long(path: str, limit: int) -> FieldError:
    return FieldError(
        "TooLong", path, OMIT, f"may not be more than {limit} {'byte' if limit == 1 else 'bytes'}"
    )


def too_many(path: str, count: int, limit: int) -> FieldError:
    return FieldError(
        "TooMany", path, count, f"must have at most {limit} {'item' if limit == 1 else 'items'}"
    )


def not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    return FieldError(
        "NotSupported", path, value, "supported values: " + ", ".join(go_value(s) for s in supported)
    )


def type_invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("TypeInvalid", path, value, detail)


@dataclass
class APIError(Exception):
    """An answer other than success: the HTTP status and the ``Status`` object sent with it."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message

    def status(self) -> dict[str, Any]:
        """The ``Status`` object (kind Status, apiVersion v1, status Failure)."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # omitted when empty, as Go's encoder does
            body["reason"] = self.reason
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


@dataclass(frozen=True)
class Names:
    """How errors name a kind: ``resourceslices.resource.k8s.io``, ``ResourceSlice.resource.k8s.io``."""

    group: str
    plural: str
    kind: str

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def details(self, name: str = "", **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if name:
            out["name"] = name
        if self.group:
            out["group"] = self.group
        out["kind"] = self.plural
        out.update(extra)
        return out


def not_found(names: Names, name: str) -> APIError:
    return APIError(404, "NotFound", f'{names.resource} "{name}" not found', names.details(name))


def already_exists(names: Names, name: str) -> APIError:
    return APIError(409, "AlreadyExists", f'{names.resource} "{name}" already exists', names.details(name))


def conflict(names: Names, name: str, why: str, *, by_kind: bool = False) -> APIError:
    """409 Conflict; ``by_kind``: named as the registry names it (``ResourceSlice.resource.k8s.io``)."""
    if by_kind:
        details = {"name": name, **({"group": names.group} if names.group else {}), "kind": names.kind}
        message = f'Operation cannot be fulfilled on {names.qualified_kind} "{name}": {why}'
        return APIError(409, "Conflict", message, details)
    message = f'Operation cannot be fulfilled on {names.resource} "{name}": {why}'
    return APIError(409, "Conflict", message, names.details(name))


OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid_object(names: Names, name: str, errors: list[FieldError]) -> APIError:
    """422 Invalid: ``<Kind>.<group> "<name>" is invalid: <error>`` or ``... is invalid: [<e1>, <e2>]``."""
    messages = list(dict.fromkeys(str(e) for e in errors))  # an aggregate drops repeated messages
    summary = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    details: dict[str, Any] = {"name": name}
    if names.group:
        details["group"] = names.group
    details["kind"] = names.kind
    details["causes"] = [{"reason": e.reason, "message": e.body, "field": e.field} for e in errors]
    return APIError(422, "Invalid", f'{names.qualified_kind} "{name}" is invalid: {summary}', details)


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def cannot_decode(names: Names, why: str) -> APIError:
    """400 for a body the API server cannot decode (strict decoding, wrong JSON types, bad quantities)."""
    # Every resource served here is at v1.
    return bad_request(f'{names.kind} in version "v1" cannot be handled as a {names.kind}: {why}')


def forbidden_error(
    names: Names, name: str, *, user: str, verb: str, subresource: str, namespace: str
) -> APIError:
    """403 as the RBAC authorizer words it."""
    resource = names.plural + (f"/{subresource}" if subresource else "")
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    why = f'User "{user}" cannot {verb} resource "{resource}" in API group "{names.group}" {scope}'
    head = f'{names.resource} "{name}"' if name else names.resource
    return APIError(403, "Forbidden", f"{head} is forbidden: {why}", names.details(name))


# Reasons and default texts for statuses a test may inject (``FakeKubeAPI.fail``).
STATUS_REASONS: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "Unauthorized"),
    404: ("NotFound", "the server could not find the requested resource"),
    405: ("MethodNotAllowed", "the server does not allow this method on the requested resource"),
    409: ("Conflict", "the server reported a conflict"),
    410: ("Expired", "the resource version is too old"),
    413: ("RequestEntityTooLarge", "the request entity is too large"),
    415: ("UnsupportedMediaType", "the body of the request was in an unknown format"),
    422: ("Invalid", "the server rejected our request due to an error in our request"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected failure"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


def injected(code: int, message: str | None, names: Names | None, name: str) -> APIError:
    reason, default = STATUS_REASONS.get(code, ("", f"injected status {code}"))
    details = names.details(name) if names is not None else {}
    headers: list[tuple[str, str]] = []
    if code == 429:
        details["retryAfterSeconds"] = 1
        headers.append(("Retry-After", "1"))
    return APIError(code, reason, message or default, details, headers)
