"""One ClaimRef: the DRA runtime, the fake kubelet and ``devplug inspect`` name a claim alike."""

from __future__ import annotations

import pytest

from devplug.dra import ClaimRef
from devplug.testing import ClaimDevice, ClaimResult


def test_one_definition_for_the_runtime_the_kit_and_inspect() -> None:
    import devplug._dra.claims
    import devplug._dra.servicer
    import devplug.models
    import devplug.testing._kubelet.dra_resource

    assert devplug.models.ClaimRef is ClaimRef
    assert devplug._dra.claims.ClaimRef is ClaimRef
    assert devplug._dra.servicer.ClaimRef is ClaimRef
    assert devplug.testing._kubelet.dra_resource.ClaimRef is ClaimRef


def test_a_claim_ref_is_a_namespace_name_uid_tuple() -> None:
    ref = ClaimRef(namespace="ns", name="c", uid="u1")
    assert ref == ("ns", "c", "u1")
    namespace, name, uid = ref
    assert (namespace, name, uid) == (ref.namespace, ref.name, ref.uid)
    assert str(ref) == "ns/c"


def test_the_servicer_reads_the_kubelet_s_claims_by_field_name() -> None:
    from devplug._dra.servicer import _refs
    from devplug._proto.dra.v1 import api_pb2 as v1

    request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", uid="u1", name="c")])
    assert _refs(request) == [ClaimRef("ns", "c", "u1")]


@pytest.mark.parametrize("ref", [ClaimRef("ns", "c", "u1"), ("ns", "c", "u1")])
def test_the_fake_kubelet_s_checks_take_a_claim_ref_or_a_plain_tuple(ref: tuple[str, str, str]) -> None:
    from devplug.testing._kubelet.dra_validation import check_prepare, check_unprepare

    answer = ClaimResult(devices=(ClaimDevice(("a",), "node", "w0", ()),))
    assert check_prepare([ref], {"u1": answer}) is None
    assert check_unprepare([ref], {"u1": "gone"}) == "NodeUnprepareResources failed for ResourceClaim c: gone"


def test_inspect_parses_a_claim_into_a_claim_ref() -> None:
    from devplug.cli.inspect.command import _claim

    assert _claim("ns/c:u1") == ClaimRef("ns", "c", "u1")
    assert type(_claim("ns/c:u1")) is ClaimRef
