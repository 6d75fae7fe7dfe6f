"""Decoding a request body against the served schema, as the API server's JSON decoder does.

The schema is lightkube-models' (generated from the Kubernetes OpenAPI of the same minor
version): a field a model does not have is an *unknown field*, a value of the wrong JSON type
cannot be decoded. Unknown fields are dropped, and reported for the ``Warning`` header or,
with ``fieldValidation=Strict``, for a 400 answer, as a real API server does; ``null`` values
are dropped as Go's decoder leaves them unset.
"""

from __future__ import annotations

import datetime
import functools
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from lightkube.models import core_v1, resource_v1

# Maps whose values are structures (the models only say ``dict``).
_MAP_VALUES: dict[tuple[type, str], type] = {
    (resource_v1.Device, "attributes"): resource_v1.DeviceAttribute,
    (resource_v1.Device, "capacity"): resource_v1.DeviceCapacity,
    (resource_v1.CounterSet, "counters"): resource_v1.Counter,
    (resource_v1.DeviceCounterConsumption, "counters"): resource_v1.Counter,
}
# Maps of strings (labels, annotations, node selectors).
_STRING_MAPS = {"labels", "annotations", "nodeSelector"}

MODELS: dict[str, type] = {
    "resourceslices": resource_v1.ResourceSlice,
    "resourceclaims": resource_v1.ResourceClaim,
    "nodes": core_v1.Node,
}


@dataclass
class Decoded:
    """What decoding found: unknown fields (dropped from the object) and the first type error."""

    unknown: list[str] = field(default_factory=list)
    type_error: str | None = None


@functools.cache
def _fields(model: type) -> dict[str, Any]:
    hints = typing.get_type_hints(model)
    names: tuple[str, ...] = model.__struct_fields__  # type: ignore[attr-defined]
    encoded: tuple[str, ...] = model.__struct_encode_fields__  # type: ignore[attr-defined]
    return {wire: hints[attr] for attr, wire in zip(names, encoded, strict=True)}


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "__struct_fields__")


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_type(tp: Any) -> str:
    if _is_struct(tp):
        return f"v1.{tp.__name__}"
    if typing.get_origin(tp) in (list, typing.List):  # noqa: UP006
        return "[]" + _go_type(_unwrap(typing.get_args(tp)[0]))
    return {str: "string", int: "int64", bool: "bool", float: "float64", datetime.datetime: "v1.Time"}.get(
        tp, "map[string]interface {}"
    )


def decode(resource: str, obj: dict[str, Any]) -> Decoded:
    """Check ``obj`` (a decoded JSON body) against the model of ``resource``, dropping unknown fields."""
    result = Decoded()
    _walk(obj, MODELS[resource], "", "", result)
    return result


def _walk(value: Any, tp: Any, path: str, owner: str, result: Decoded) -> None:
    """Check ``value`` at ``path`` (a field of the struct ``owner``) against the type ``tp``."""
    tp = _unwrap(tp)
    if tp is Any or result.type_error:
        return
    origin = typing.get_origin(tp)
    if _is_struct(tp):
        _struct(value, tp, path, owner, result)
    elif origin in (list, typing.List):  # noqa: UP006 - the models use typing.List
        if not isinstance(value, list):
            _mismatch(value, tp, path, owner, result)
            return
        for i, item in enumerate(value):
            _walk(item, typing.get_args(tp)[0], f"{path}[{i}]", owner, result)
    elif tp in (dict, typing.Dict) or origin in (dict, typing.Dict):  # noqa: UP006
        _string_map(value, tp, path, owner, result)
    else:
        _scalar(value, tp, path, owner, result)


def _struct(value: Any, tp: type, path: str, owner: str, result: Decoded) -> None:
    if not isinstance(value, dict):
        _mismatch(value, tp, path, owner, result)
        return
    fields = _fields(tp)
    for key in list(value):
        sub = f"{path}.{key}" if path else key
        if key not in fields:
            result.unknown.append(sub)
            del value[key]
        elif value[key] is None:
            del value[key]
        elif (tp, key) in _MAP_VALUES:
            _map(value[key], _MAP_VALUES[tp, key], sub, tp.__name__, result)
        else:
            _walk(value[key], fields[key], sub, tp.__name__, result)


def _string_map(value: Any, tp: Any, path: str, owner: str, result: Decoded) -> None:
    if not isinstance(value, dict):
        _mismatch(value, tp, path, owner, result)
        return
    if path.rpartition(".")[2] in _STRING_MAPS and owner in ("ObjectMeta", "NodeSpec", "PodSpec"):
        for key, item in value.items():
            if not isinstance(item, str):
                _mismatch(item, str, f"{path}.{key}", owner, result)
                return


def _scalar(value: Any, tp: Any, path: str, owner: str, result: Decoded) -> None:
    expected = {str: str, int: int, bool: bool, float: (int, float), datetime.datetime: str}.get(tp)
    if expected is None:
        return
    if (isinstance(value, bool) and tp is not bool) or not isinstance(value, expected):  # type: ignore[arg-type]
        _mismatch(value, tp, path, owner, result)


def _map(value: Any, item_type: type, path: str, owner: str, result: Decoded) -> None:
    if not isinstance(value, dict):
        _mismatch(value, dict, path, owner, result)
        return
    for key, item in value.items():
        _walk(item, item_type, f"{path}.{key}", owner, result)


def _mismatch(value: Any, tp: Any, path: str, owner: str, result: Decoded) -> None:
    # encoding/json: "json: cannot unmarshal string into Go struct field ResourcePool.spec.pool.generation
    # of type int64" (the path without list indexes).
    where = re.sub(r"\[\d+\]", "", path)
    into = f"Go struct field {owner}.{where} of type {_go_type(tp)}"
    result.type_error = f"json: cannot unmarshal {_json_type(value)} into {into}"
