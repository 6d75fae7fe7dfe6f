"""A fake resource: devices from a count or a live state file, shaped by a fault scenario."""

from __future__ import annotations

import json
import math
import random
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import anyio
from asyncinotify import Inotify, Mask
from pydantic import ValidationError

from devplug import ContainerAllocation, Device, DevicePlugin, DeviceSpec, Health, HealthPolicy
from devplug.models import CapacityRequestPolicy
from devplug_fake._config import FakeResource, StateFile

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from devplug.cdi import CdiSpec

__all__ = ["FakePlugin", "PolicyFakePlugin"]

# Whole-file events only: a write in progress (IN_MODIFY) would be read half-written.
_STATE_FILE_EVENTS = Mask.CLOSE_WRITE | Mask.MOVED_TO | Mask.DELETE | Mask.MOVED_FROM | Mask.ONLYDIR


class FakePlugin(DevicePlugin):
    """Serves one :class:`FakeResource`.

    With a ``policy`` configured, ``FakePlugin(config)`` is a :class:`PolicyFakePlugin`: the
    options sent to the kubelet follow from which hooks a class overrides, so preferred
    allocation is offered only by the subclass that defines it.
    """

    # A fake leaves nothing behind: its spec describes devices that exist only while it runs.
    remove_cdi_spec_on_stop = True

    def __new__(cls, config: FakeResource) -> FakePlugin:
        with_policy = cls is FakePlugin and config.policy is not None
        return super().__new__(PolicyFakePlugin if with_policy else cls)

    def __init__(self, config: FakeResource) -> None:
        self.config = config
        self.resource_name = config.name
        self._rng = random.Random(config.faults.seed)  # noqa: S311 - replayable faults, not secrets
        self._calls = 0

    def generated_devices(self) -> list[Device]:
        k = self.config.numa_nodes
        shared = _shared(self.config.shares)
        return [
            Device(id=f"fake-{i}", numa_nodes=(i % k,) if k else (), **shared)
            for i in range(self.config.count)
        ]

    def read_state_file(self) -> list[Device] | None:
        """The state file's devices, or None (logged) if it is missing or invalid."""
        import yaml  # loaded with the first state file, not at start

        path = self.config.state_file
        assert path is not None
        try:
            data = _parse(path.read_text())
            return list(StateFile.model_validate(data).devices)
        except FileNotFoundError:
            self.log.warning("state_file_missing", path=str(path))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            self.log.error("state_file_invalid", path=str(path), error=str(exc).splitlines()[0])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            self.log.error("state_file_invalid", path=str(path), error=f"{where}: {first['msg']}")
        return None

    def devices_at(self, base: Sequence[Device], t: float) -> list[Device]:
        """The device set ``t`` seconds after start: base, then the timeline, then the flaps."""
        devices = {d.id: d for d in base}
        for change in sorted(self.config.faults.timeline, key=lambda c: c.at):
            if change.at > t:
                break
            for device_id in change.remove:
                devices.pop(device_id, None)
            devices.update((d.id, d) for d in change.add)
        for flap in self.config.faults.health_flaps:
            if (
                flap.device in devices
                and t >= flap.first_at
                and (t - flap.first_at) % flap.every < flap.down_for
            ):
                why = f"health flap: Unhealthy for {flap.down_for:g} s every {flap.every:g} s"
                devices[flap.device] = devices[flap.device].with_health(Health.UNHEALTHY, why)
        return list(devices.values())

    def next_change_after(self, t: float) -> float:
        """When the scenario next changes something (inf: never)."""
        times = [c.at for c in self.config.faults.timeline if c.at > t]
        for flap in self.config.faults.health_flaps:
            if t < flap.first_at:
                times.append(flap.first_at)
                continue
            start = flap.first_at + math.floor((t - flap.first_at) / flap.every) * flap.every
            times += [x for x in (start + flap.down_for, start + flap.every) if x > t]
        return min(times, default=math.inf)

    async def watch_devices(self) -> AsyncIterator[Sequence[Device]]:
        state_file = self.config.state_file
        # The health policy judges the state file's health values: each read is one check.
        policy = HealthPolicy(self.config.health, log=self.log) if self.config.health and state_file else None
        with ExitStack() as stack:
            inotify = None
            if state_file is not None:
                # Watch the directory, not the file: editors and atomic writers replace the
                # file (a rename), and a deleted file can come back.
                inotify = stack.enter_context(Inotify())
                state_file.parent.mkdir(parents=True, exist_ok=True)
                inotify.add_watch(state_file.parent, _STATE_FILE_EVENTS)
            start = anyio.current_time()
            # With a state file, its devices (none until it is valid) replace the generated ones.
            base = (
                self._checked(policy, self.read_state_file(), [], start)
                if state_file
                else self.generated_devices()
            )
            while True:
                clock = anyio.current_time()
                now = clock - start
                yield self.devices_at(policy.reported(base, clock) if policy else base, now)
                wait = self.next_change_after(now) - now
                deadline = policy.next_deadline() if policy else None
                if deadline is not None:
                    wait = min(wait, deadline - clock)
                with anyio.move_on_after(max(wait, 0.0)):
                    if inotify is None or state_file is None:
                        await anyio.sleep_forever()
                        continue
                    while True:
                        event = await inotify.get()
                        if event.name is not None and event.name.name == state_file.name:
                            break
                    loaded = self.read_state_file()
                    base = self._checked(policy, loaded, base, anyio.current_time())
                    if loaded is not None:
                        self.log.info("state_file_applied", devices=len(base))

    def _checked(
        self, policy: HealthPolicy | None, loaded: list[Device] | None, base: list[Device], clock: float
    ) -> list[Device]:
        """The devices after a state-file read (None: missing or invalid, so the last ones stay)."""
        if policy is not None:
            if loaded is not None:
                policy.update(loaded, clock)
            else:  # the check could not tell: unknown, not unhealthy
                policy.update(base, clock, unknown={d.id for d in base})
        return loaded if loaded is not None else base

    def cdi_spec(self, devices: Sequence[Device]) -> CdiSpec | None:
        """With ``cdi``: one CDI device per fake device, a /dev/null node at /dev/<id>."""
        if not self.config.cdi:
            return None
        from devplug import cdi

        named = []
        for device in devices:
            try:
                cdi.validate_device_name(device.id)
            except ValueError:
                continue  # allocate still names it; the runtime will say it is unknown
            node = cdi.DeviceNode(path=f"/dev/{device.id}", host_path="/dev/null", permissions="rw")
            named.append(
                cdi.CdiDevice(name=device.id, container_edits=cdi.ContainerEdits(device_nodes=(node,)))
            )
        if not named:
            return None
        return cdi.CdiSpec(
            kind=self.resource_name,
            devices=tuple(named),
            container_edits=cdi.ContainerEdits(env=(f"FAKE_CDI_RESOURCE={self.resource_name}",)),
        )

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        faults = self.config.faults
        self._calls += 1
        if faults.allocate_latency:
            await anyio.sleep(faults.allocate_latency)
        every = faults.allocate_error_every
        if (every and self._calls % every == 0) or (
            faults.allocate_error_probability and self._rng.random() < faults.allocate_error_probability
        ):
            raise RuntimeError(f"injected allocate error (call {self._calls})")
        ids = [d.id for d in devices]
        return ContainerAllocation(
            envs={"FAKE_VISIBLE_DEVICES": ",".join(ids)},
            devices=tuple(DeviceSpec.rw("/dev/null", f"/dev/{i}") for i in ids)
            if self.config.device_specs
            else (),
            cdi_devices=tuple(f"{self.resource_name}={i}" for i in ids) if self.config.cdi else (),
        )


class PolicyFakePlugin(FakePlugin):
    """A fake resource that offers preferred allocation with the configured policy."""

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str] | None:
        from devplug import policies  # loaded by the first call: a resource without a policy never needs it

        numa = {d.id: d.numa_nodes or None for d in (*available, *must_include)}
        policy = self.config.policy
        if policy == "packed":
            return policies.packed(available, must_include, size, key=numa)
        if policy == "spread":
            return policies.spread(available, must_include, size, key=numa)
        if policy == "numa":
            return policies.numa_aligned(available, must_include, size)
        return policies.first_available(available, must_include, size)


def _parse(text: str) -> object:
    """A state file's content. JSON is read with the json module (a 50,000-device file in
    milliseconds, where PyYAML's pure-Python loader takes seconds); YAML with the C loader
    when PyYAML has one."""
    if text.lstrip().startswith(("{", "[")):
        return json.loads(text)
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loaders only


def _shared(shares: int) -> dict[str, Any]:
    """What makes a generated device shared by up to ``shares`` claims (none for 0): a capacity
    ``shares`` taken in whole units, 1 by default."""
    if not shares:
        return {}
    # One step from min must stay within the capacity: a single share is a valid value instead.
    policy = (
        CapacityRequestPolicy(default="1", min="1", step="1")
        if shares > 1
        else CapacityRequestPolicy(default="1", valid_values=("1",))
    )
    return {
        "capacity": {"shares": str(shares)},
        "allow_multiple_allocations": True,
        "request_policies": {"shares": policy},
    }
