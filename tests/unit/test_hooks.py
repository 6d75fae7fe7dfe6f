"""Which hooks a plugin class overrides (devplug._hooks), read from outside the class: an author's
subclass may use any other name, ``options`` included, and devplug serves it the same."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from devplug import ContainerAllocation, Device, DevicePlugin, PluginOptions
from devplug._hooks import OptionalHook, advertised_options, overrides
from devplug.cdi import CdiDevice, CdiSpec
from devplug.dra import AllocatedDevice, Claim, OpaqueConfig, PreparedDevice
from devplug.testing import FakeKubelet
from tests.dra.claims_kit import World, claim
from tests.support import Widgets, serving, settings_for

RESOURCE = "example.com/widget"


class _Base(DevicePlugin):
    resource_name = "example.com/x"

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        yield []

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        return ContainerAllocation()


class _WithPreferred(_Base):
    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str] | None:
        return None


class _WithPreStart(_Base):
    async def pre_start_container(self, devices: Sequence[Device]) -> None:
        return None


class _WithBoth(_WithPreferred, _WithPreStart):
    pass


class _WithSpec(_Base):
    def cdi_spec(self, devices: Sequence[Device]) -> CdiSpec | None:
        return CdiSpec(kind="example.com/x", devices=(CdiDevice(name="a"),))


class _WithClaims(_Base):
    async def prepare_claim(
        self, claim: Claim, devices: Sequence[AllocatedDevice], config: Sequence[OpaqueConfig]
    ) -> Sequence[PreparedDevice] | None:
        return None

    async def unprepare_claim(self, claim: Claim) -> None:
        return None


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (_Base, PluginOptions()),
        (_WithPreferred, PluginOptions(get_preferred_allocation_available=True)),
        (_WithPreStart, PluginOptions(pre_start_required=True)),
        (_WithBoth, PluginOptions(get_preferred_allocation_available=True, pre_start_required=True)),
        (_WithClaims, PluginOptions()),
    ],
)
def test_options_follow_overridden_hooks(cls: type[DevicePlugin], expected: PluginOptions) -> None:
    assert advertised_options(cls) == expected


@pytest.mark.parametrize(
    ("cls", "overridden"),
    [
        (_Base, set()),
        (_WithBoth, {"preferred_allocation", "pre_start_container"}),
        (_WithSpec, {"cdi_spec"}),
        (_WithClaims, {"prepare_claim", "unprepare_claim"}),
    ],
)
def test_overrides_names_the_overridden_hooks(cls: type[DevicePlugin], overridden: set[str]) -> None:
    hooks: list[OptionalHook] = [
        "preferred_allocation",
        "pre_start_container",
        "cdi_spec",
        "prepare_claim",
        "unprepare_claim",
        "release_device",
    ]
    assert {h for h in hooks if overrides(cls, h)} == overridden


def test_the_base_class_holds_only_the_authors_api() -> None:
    """What an author implements, overrides or sets, and nothing the framework asks for itself."""
    assert {n for n in dir(DevicePlugin) if not n.startswith("_")} == {
        "allocate",
        "cdi_spec",
        "dra_partition_type_attribute",
        "dra_standard_attributes",
        "from_settings",
        "log",
        "pre_start_container",
        "preferred_allocation",
        "prepare_claim",
        "release_device",
        "remove_cdi_spec_on_stop",
        "settings_class",
        "unprepare_claim",
        "watch_devices",
    }


class OwnNames(Widgets):
    """Uses for its own purposes the names DevicePlugin once answered devplug's questions with."""

    options = {"colour": "red"}  # noqa: RUF012 - the author's own attribute, not a hook
    writes_cdi_spec = "never"
    prepares_claims = True
    unprepares_claims = True

    def advertised_options(self) -> Any:
        raise AssertionError("devplug does not call the author's methods of other names")


@pytest.mark.anyio
async def test_a_plugin_may_define_options_and_still_serves(short_dir: Path) -> None:
    settings = settings_for(short_dir)
    async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(OwnNames(), settings):
        registration = await kubelet.wait_for_registration(RESOURCE)
        assert registration.accepted and registration.options == PluginOptions()
        assert await kubelet.get_options(RESOURCE) == PluginOptions()
        await kubelet.wait_for_devices(RESOURCE, lambda devices: len(devices) == 4)
        allocation = await kubelet.allocate(RESOURCE, ["w1"])
        assert allocation.envs == {"WIDGETS": "w1"}


@pytest.mark.anyio
async def test_a_driver_whose_names_read_like_hooks_prepares_by_default(tmp_path: Path) -> None:
    w = World(tmp_path, OwnNames())
    ref = w.add(claim("u1", [("a", "w0")]))
    assert not (await w.preparer.prepare([ref]))["u1"].error
    assert w.plugin.allocations == [["w0"]]  # allocate: the default preparation, no hook
    assert not (await w.preparer.unprepare([ref]))["u1"].error
