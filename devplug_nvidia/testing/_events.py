"""The event part of the fake NVML: event sets, registration, and a queue tests push into.

``nvmlEventSetWait`` blocks the calling thread (as the real one does) until an event arrives or
the timeout passes; run it in a worker thread. Events go to every set that registered the GPU
for that event type, and are dropped otherwise, as NVML drops them.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devplug_nvidia.testing import _errors as C
from devplug_nvidia.testing._base import FakeBase, api
from devplug_nvidia.testing._structs import EventData

if TYPE_CHECKING:
    from devplug_nvidia.testing._handles import Device

#: The GPU- / compute-instance ID an event for the whole GPU carries.
WHOLE_GPU = 0xFFFFFFFF


@dataclass(eq=False)
class EventSet:
    """A fake ``nvmlEventSet_t``."""

    registered: dict[int, int] = field(default_factory=dict)
    """GPU index → registered event-type mask."""
    queue: deque[EventData | int] = field(default_factory=deque)
    """Pending events, or an NVML error code the next wait raises."""
    cond: threading.Condition = field(default_factory=threading.Condition)
    freed: bool = False


class EventsApi(FakeBase):
    """Event functions of :class:`FakeNvml`, and the test controls that feed them."""

    _event_sets: list[EventSet]

    def _sets(self) -> list[EventSet]:
        if not hasattr(self, "_event_sets"):
            self._event_sets = []
        return self._event_sets

    @api
    def nvmlEventSetCreate(self) -> EventSet:
        event_set = EventSet()
        self._sets().append(event_set)
        return event_set

    @api
    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        return self._gpu(handle).spec.supported_events

    @api
    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: EventSet) -> None:
        device = self._gpu(handle)
        if not device.spec.events_supported or eventTypes & ~device.spec.supported_events:
            raise C.NVMLError_NotSupported()
        if eventSet.freed:
            raise C.NVMLError_InvalidArgument()
        with eventSet.cond:
            eventSet.registered[device.index] = eventSet.registered.get(device.index, 0) | eventTypes

    @api
    def nvmlEventSetWait(self, eventSet: EventSet, timeoutms: int) -> EventData:
        with eventSet.cond:
            if not eventSet.cond.wait_for(lambda: bool(eventSet.queue) or eventSet.freed, timeoutms / 1000):
                raise C.NVMLError_Timeout()
            if eventSet.freed:
                raise C.NVMLError_Uninitialized()
            item = eventSet.queue.popleft()
        if isinstance(item, int):
            raise C.NVMLError(item)
        return item

    @api
    def nvmlEventSetFree(self, eventSet: EventSet) -> None:
        with eventSet.cond:
            eventSet.freed = True
            eventSet.cond.notify_all()
        if eventSet in self._sets():
            self._sets().remove(eventSet)

    # -- test controls ---------------------------------------------------------------------------

    def push_xid(
        self,
        gpu: int,
        xid: int,
        *,
        gpu_instance_id: int = WHOLE_GPU,
        compute_instance_id: int = WHOLE_GPU,
    ) -> int:
        """Raise XID ``xid`` on GPU ``gpu`` (optionally on one MIG GI/CI); returns the sets reached."""
        return self._push(gpu, C.nvmlEventTypeXidCriticalError, xid, gpu_instance_id, compute_instance_id)

    def push_ecc(self, gpu: int, *, double_bit: bool = True) -> int:
        """An ECC error event (double-bit by default) on GPU ``gpu``; returns the sets reached."""
        kind = C.nvmlEventTypeDoubleBitEccError if double_bit else C.nvmlEventTypeSingleBitEccError
        return self._push(gpu, kind, 0, WHOLE_GPU, WHOLE_GPU)

    def push_error(self, code: int) -> None:
        """Make the next wait on every event set raise NVML error ``code`` (e.g. a timeout)."""
        for event_set in list(self._sets()):
            with event_set.cond:
                event_set.queue.append(code)
                event_set.cond.notify_all()

    def push_timeout(self) -> None:
        """Make the next wait on every event set time out at once."""
        self.push_error(C.NVML_ERROR_TIMEOUT)

    def lose_gpu(self, gpu: int) -> None:
        """GPU ``gpu`` falls off the bus: calls on it raise GPU_IS_LOST, as does the next wait."""
        self.devices[gpu].lost = True
        self.push_error(C.NVML_ERROR_GPU_IS_LOST)

    def _push(self, gpu: int, kind: int, data: int, gi: int, ci: int) -> int:
        device: Device = self.devices[gpu]
        reached = 0
        for event_set in list(self._sets()):
            with event_set.cond:
                if event_set.registered.get(gpu, 0) & kind:
                    event_set.queue.append(EventData(device, kind, data, gi, ci))
                    event_set.cond.notify_all()
                    reached += 1
        return reached
