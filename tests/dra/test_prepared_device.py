"""PreparedDevice speaks of CDI names as ContainerAllocation does (``cdi_devices``, checked the
same way); its old field names still work, with a DeprecationWarning."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from devplug import ContainerAllocation
from devplug.dra import CdiSpecFile, PreparedDevice

SPEC = CdiSpecFile(name="k8s.x-claim_u1.json", text="{}")


def prepared(**fields: Any) -> PreparedDevice:
    return PreparedDevice(name="d0", **fields)


def allocation(**fields: Any) -> ContainerAllocation:
    return ContainerAllocation(**fields)


@pytest.mark.parametrize("make", [prepared, allocation])
def test_one_name_and_one_check_for_cdi_names(make: Any) -> None:
    assert make(cdi_devices=("example.com/gpu=0",)).cdi_devices == ("example.com/gpu=0",)
    for bad in ("gpu0", "example.com/gpu", "example.com/gpu=", "gpu=0"):
        with pytest.raises(ValidationError, match="fully qualified"):
            make(cdi_devices=(bad,))


def test_the_new_names_do_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    device = prepared(cdi_devices=("k8s.x/claim=a",), cdi_spec_file=SPEC)
    assert (device.cdi_devices, device.cdi_spec_file) == (("k8s.x/claim=a",), SPEC)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_the_old_names_still_work_and_warn() -> None:
    with pytest.warns(DeprecationWarning, match="cdi_device_ids is deprecated: use cdi_devices") as caught:
        device = prepared(cdi_device_ids=("k8s.x/claim=a",))
    assert caught[0].filename == __file__  # the author's line, not pydantic's
    assert device == prepared(cdi_devices=("k8s.x/claim=a",))
    with pytest.warns(DeprecationWarning, match="cdi_spec is deprecated: use cdi_spec_file"):
        assert prepared(cdi_spec=SPEC).cdi_spec_file == SPEC
    with pytest.warns(DeprecationWarning, match="cdi_device_ids") as caught:
        assert device.cdi_device_ids == ("k8s.x/claim=a",)
    assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="cdi_spec is deprecated"):
        assert prepared(cdi_spec_file=SPEC).cdi_spec == SPEC


def test_an_old_and_a_new_name_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="not both"):
        prepared(cdi_devices=("k8s.x/claim=a",), cdi_device_ids=("k8s.x/claim=b",))
