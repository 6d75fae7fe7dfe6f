"""The ledger of device holders: what each API withholds, and when a hold ends."""

from __future__ import annotations

from devplug._runtime.ledger import Ledger
from devplug._runtime.podresources import Holder
from devplug.models import CounterConsumption, Device

R = "example.com/gpu"
POD = Holder("team-a", "train-0", "main")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ledger_with(*devices: Device, grace: float = 30.0) -> tuple[Ledger, Clock]:
    clock = Clock()
    ledger = Ledger(grace=grace, clock=clock)
    ledger.set_devices((f"gpu-{d.id}", R, d) for d in devices)
    return ledger, clock


def test_an_allocate_withholds_the_device_from_dra_until_a_read_past_the_grace_misses_it() -> None:
    ledger, clock = ledger_with(Device(id="0"), Device(id="1"))
    ledger.allocated(R, ["0"])
    why = ledger.from_dra("gpu-0")
    assert why is not None
    assert (why.api, why.holder) == ("device-plugin", "an Allocate")
    assert "held through the device plugin by an Allocate" in str(why)
    assert ledger.from_dra("gpu-1") is None
    # A read right after the Allocate may not list it yet: kept.
    ledger.pods({}, read_at=clock.now + 1)
    assert ledger.from_dra("gpu-0") is not None
    # A read started past the grace that does not list it: released.
    ledger.pods({}, read_at=clock.now + 31)
    assert ledger.from_dra("gpu-0") is None


def test_a_listed_pod_holds_the_device_until_a_read_no_longer_lists_it() -> None:
    ledger, clock = ledger_with(Device(id="0"))
    ledger.allocated(R, ["0"])
    ledger.pods({(R, "0"): [POD]}, read_at=clock.now + 1)
    why = ledger.from_dra("gpu-0")
    assert why is not None
    assert why.holder == "team-a/train-0 (container main)"
    holder = ledger.holder(R, "0")
    assert holder is not None
    assert holder.api == "device-plugin"
    assert ledger.counts() == {"device-plugin": 1, "dra": 0}
    ledger.pods({}, read_at=clock.now + 2)  # the pod ended
    assert ledger.from_dra("gpu-0") is None
    assert ledger.holder(R, "0") is None


def test_a_claim_withholds_its_devices_from_the_device_plugin_side_while_allocated_or_prepared() -> None:
    ledger, _ = ledger_with(Device(id="0"), Device(id="1"))
    ledger.claims({"uid-1": ("ns/claim-1", ["gpu-1"])})
    why = ledger.from_plugin(R, "1")
    assert why is not None
    assert str(why) == "held through DRA by ns/claim-1"
    assert ledger.from_plugin(R, "0") is None
    ledger.prepared("uid-1", "ns/claim-1", ["gpu-1"])
    ledger.claim("uid-1", "ns/claim-1", None)  # deleted in the API server, not unprepared yet
    assert ledger.from_plugin(R, "1") is not None
    ledger.unprepared("uid-1")
    assert ledger.from_plugin(R, "1") is None
    assert ledger.counts() == {"device-plugin": 0, "dra": 0}


def test_a_partition_and_its_whole_device_overlap_through_their_counter_set() -> None:
    whole = Device(id="0", consumes_counters=(CounterConsumption(counter_set="gpu-0", counters={"mem": 8}),))
    part = Device(id="0-a", consumes_counters=(CounterConsumption(counter_set="gpu-0", counters={"mem": 4}),))
    other = Device(id="1", consumes_counters=(CounterConsumption(counter_set="gpu-1", counters={"mem": 4}),))
    ledger, clock = ledger_with(whole, part, other)
    ledger.claims({"u": ("ns/c", ["gpu-0-a"])})
    assert ledger.from_plugin(R, "0") is not None
    assert ledger.from_plugin(R, "1") is None
    ledger.pods({(R, "1"): [POD]}, read_at=clock.now)
    assert ledger.from_dra("gpu-1") is not None
    assert ledger.from_dra("gpu-0-a") is None


def test_a_replica_id_holds_the_device_it_names() -> None:
    ledger, clock = ledger_with(Device(id="GPU-abc"))
    ledger.pods({(R, "GPU-abc::3"): [POD]}, read_at=clock.now)
    assert ledger.from_dra("gpu-GPU-abc") is not None


def test_ready_once_both_sides_were_read_and_every_change_is_announced_to_its_side() -> None:
    ledger, clock = ledger_with(Device(id="0"), Device(id="1"))
    calls: list[int] = []
    stop = ledger.listen(lambda: calls.append(ledger.changes.version))
    plugin_side = ledger.plugin_changes.version
    assert not ledger.ready
    ledger.pods({}, read_at=clock.now)
    assert not ledger.ready
    ledger.claims({})
    assert ledger.ready
    assert len(calls) == 2  # readiness concerns both sides
    assert ledger.plugin_changes.version == plugin_side + 2
    ledger.pods({}, read_at=clock.now)  # nothing changed: no announcement
    assert len(calls) == 2
    # An Allocate changes what DRA withholds, not what the device-plugin side does.
    ledger.allocated(R, ["0"])
    assert len(calls) == 2
    assert ledger.plugin_changes.version == plugin_side + 3
    # A claim changes what the device-plugin side withholds, not what DRA does.
    ledger.claim("u", "ns/c", ["gpu-1"])
    assert len(calls) == 3
    assert ledger.plugin_changes.version == plugin_side + 3
    ledger.prepared("u", "ns/c", ["gpu-1"])
    ledger.prepared("u", "ns/c", ["gpu-1"])  # the same again: no announcement
    assert len(calls) == 4
    stop()
    ledger.unprepared("u")
    assert len(calls) == 4


def test_a_refusal_is_counted_every_time_and_logged_once_per_device_and_holder() -> None:
    ledger, _ = ledger_with(Device(id="0"))
    ledger.claims({"u": ("ns/c", ["gpu-0"])})
    why = ledger.from_plugin(R, "0")
    assert why is not None
    assert ledger.refused("allocate", "gpu-0", why)
    assert not ledger.refused("allocate", "gpu-0", why)
    assert ledger.conflicts["allocate"] == 2
    state = ledger.state()
    assert state["conflicts"] == {"allocate": 2}
    assert state["dra"] == ["gpu-0: ns/c"]


def test_a_device_listed_under_another_resource_name_is_matched_by_its_id() -> None:
    # NVIDIA's device plugin with the mixed MIG strategy lists MIG devices as nvidia.com/mig-*.
    ledger, clock = ledger_with(Device(id="MIG-1"), Device(id="MIG-2"))
    ledger.pods(
        {("nvidia.com/mig-1g.5gb", "MIG-2"): [POD], ("other.com/nic", "eth0"): [POD]}, read_at=clock.now
    )
    assert ledger.from_dra("gpu-MIG-2") is not None
    assert ledger.from_dra("gpu-MIG-1") is None
    assert ledger.counts() == {"device-plugin": 1, "dra": 0}  # the NIC is none of ours
    holder = ledger.holder(R, "MIG-2")
    assert holder is not None
    assert holder.holder == str(POD)
