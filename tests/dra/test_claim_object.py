"""Claim.resource_claim: typed for type checkers (ResourceClaimDict), the API server's object
with every field at run time."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from devplug.dra import Claim, ResourceClaimDict

OBJECT: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"uid": "u1", "namespace": "ns", "name": "c", "labels": {"a": "b"}},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    "status": {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "d", "pool": "p", "device": "g0", "future": 1}],
                "config": [{"source": "FromClaim", "opaque": {"driver": "d", "parameters": {"x": 1}}}],
            }
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
    },
    "someFieldOfALaterRelease": {"kept": True},
}


def test_every_field_of_the_object_is_kept() -> None:
    claim = Claim(uid="u1", namespace="ns", name="c", resource_claim=OBJECT)  # type: ignore[arg-type]
    assert claim.resource_claim == OBJECT
    assert Claim(uid="u1", namespace="ns", name="c").resource_claim is None


def _field(typed: Any, path: str) -> Any:
    """The type of ``path`` (``status.allocation.devices``; ``[]`` for a list's items) in ``typed``."""
    for part in path.split("."):
        items = part.endswith("[]")
        typed = typing.get_type_hints(typed)[part.removesuffix("[]")]
        if items:
            (typed,) = typing.get_args(typed)
    return typed


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.uid", str),
        ("metadata.name", str),
        ("metadata.namespace", str),
        ("status.allocation.devices.results[].request", str),
        ("status.allocation.devices.results[].driver", str),
        ("status.allocation.devices.results[].pool", str),
        ("status.allocation.devices.results[].device", str),
        ("status.allocation.devices.results[].adminAccess", bool),
        ("status.allocation.devices.results[].shareID", str),
        ("status.allocation.devices.config[].source", str),
        ("status.allocation.devices.config[].requests", list[str]),
        ("status.allocation.devices.config[].opaque.driver", str),
        ("status.allocation.devices.config[].opaque.parameters", dict[str, Any]),
    ],
)
def test_the_fields_devplug_and_drivers_read_are_typed(path: str, expected: object) -> None:
    assert _field(ResourceClaimDict, path) == expected
