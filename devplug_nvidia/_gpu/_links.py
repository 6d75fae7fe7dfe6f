"""The link matrix of the full GPUs: PCIe topology levels and NVLink counts, read once from NVML.

Preferred allocation scores pairs of GPUs from this matrix instead of walking NVML on every
request (upstream does, and fails the request when a GPU is gone). Scores are upstream's
(nvidia.md §6): the PCIe level of the pair's common ancestor (SYSTEM 10 ... INTERNAL 60) plus
100 per NVLink between them.

NVLinks that end at an NVSwitch (``nvmlDeviceGetNvLinkRemoteDeviceType`` = SWITCH) report the
switch's bus ID, not the peer GPU's, so counting links to the peer's bus ID finds none there.
Two GPUs attached to the same switches are connected through them: a pair counts, per switch,
the smaller of the two GPUs' link counts to it (12 on a DGX A100, 18 on a DGX H100, fewer when
links are down), as ``nvidia-smi topo -m`` reports.

A GPU that fails while being read (GPU_IS_LOST, any NVML error) gets no links: it scores 0
with every other GPU and never makes the read fail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING, Any

import structlog

from devplug.topology import normalize_pci_bus_id
from devplug_nvidia._gpu import _nvml
from devplug_nvidia._gpu._nvml import NvmlError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from devplug_nvidia._gpu._nvml import Nvml

__all__ = ["LEVEL_SCORES", "NVLINK_SCORE", "GpuLinks", "LinkMatrix", "read_links"]

log = structlog.get_logger(__name__)

# NVML_TOPOLOGY_* values (stable across NVML versions) → upstream's pair scores.
LEVEL_SCORES: dict[int, int] = {
    50: 10,  # SYSTEM: across CPU sockets
    40: 20,  # NODE: same NUMA node, different host bridges
    30: 30,  # HOSTBRIDGE
    20: 40,  # MULTIPLE: several PCIe switches
    10: 50,  # SINGLE: one PCIe switch
    0: 60,  # INTERNAL: same board
}
"""Topology level (``nvmlDeviceGetTopologyCommonAncestor``) → pair score."""
NVLINK_SCORE = 100
"""Score per NVLink between two GPUs."""

_SWITCH_TYPE_NAME = "NVML_NVLINK_DEVICE_TYPE_SWITCH"
_SWITCH_TYPE_DEFAULT = 2


@dataclass(frozen=True)
class GpuLinks:
    """What one GPU's NVLinks reach (enabled links only)."""

    uuid: str
    bus_id: str
    """sysfs form, ``0000:07:00.0``."""
    gpu_peers: Mapping[str, int] = field(default_factory=dict)
    """Bus ID of a GPU at the other end → number of links to it."""
    switches: Mapping[str, int] = field(default_factory=dict)
    """Bus ID of an NVSwitch at the other end → number of links to it."""
    lost: bool = False
    """The GPU could not be read (fell off the bus): it has no links."""


@dataclass(frozen=True)
class LinkMatrix:
    """Pair facts of the full GPUs, keyed by GPU UUID; pure data once built.

    Build it with :func:`read_links` at start-up, or with :meth:`build` from facts (tests).
    """

    gpus: tuple[str, ...] = ()
    """GPU UUIDs in NVML index order (lost ones included)."""
    levels: Mapping[frozenset[str], int] = field(default_factory=dict)
    """Pair → NVML topology level; a pair missing here has no PCIe score."""
    nvlinks: Mapping[frozenset[str], int] = field(default_factory=dict)
    """Pair → number of NVLinks between them (direct or through shared NVSwitches)."""
    lost: frozenset[str] = frozenset()
    """GPUs that get no links (could not be read, or dropped by :meth:`without`)."""

    @classmethod
    def build(cls, gpus: Iterable[GpuLinks], levels: Mapping[frozenset[str], int]) -> LinkMatrix:
        """The matrix of ``gpus`` with the pairwise PCIe ``levels``; NVLinks counted as the module says."""
        listed = list(gpus)
        nvlinks: dict[frozenset[str], int] = {}
        for a, b in combinations(listed, 2):
            if a.lost or b.lost:
                continue
            direct = _direct(a, b)
            shared = sum(min(n, b.switches.get(s, 0)) for s, n in a.switches.items())
            if direct + shared:
                nvlinks[frozenset((a.uuid, b.uuid))] = direct + shared
        lost = frozenset(g.uuid for g in listed if g.lost)
        kept = {pair: level for pair, level in levels.items() if not pair & lost}
        return cls(gpus=tuple(g.uuid for g in listed), levels=kept, nvlinks=nvlinks, lost=lost)

    def score(self, a: str, b: str) -> int:
        """Upstream's score of the pair (0 for a GPU with itself, unknown or lost GPUs)."""
        if a == b:
            return 0
        pair = frozenset((a, b))
        level = self.levels.get(pair)
        return (0 if level is None else LEVEL_SCORES.get(level, 0)) + NVLINK_SCORE * self.nvlinks.get(pair, 0)

    def set_score(self, uuids: Collection[str]) -> int:
        """The score of a set: the sum over its pairs."""
        return sum(self.score(a, b) for a, b in combinations(list(dict.fromkeys(uuids)), 2))

    def links(self, a: str, b: str) -> int:
        """NVLinks between two GPUs."""
        return self.nvlinks.get(frozenset((a, b)), 0)

    def without(self, uuids: Iterable[str]) -> LinkMatrix:
        """This matrix with ``uuids`` given no links (a GPU that went unhealthy), no NVML needed."""
        gone = frozenset(uuids) & frozenset(self.gpus)
        if not gone - self.lost:
            return self
        return LinkMatrix(
            gpus=self.gpus,
            levels={p: v for p, v in self.levels.items() if not p & gone},
            nvlinks={p: v for p, v in self.nvlinks.items() if not p & gone},
            lost=self.lost | gone,
        )

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary (for logs and the hardware check)."""
        index = {u: n for n, u in enumerate(self.gpus)}

        def name(pair: frozenset[str]) -> str:
            return "-".join(str(i) for i in sorted(index[u] for u in pair))

        return {
            "gpus": len(self.gpus),
            "lost": sorted(index[u] for u in self.lost),
            "nvlinks": {name(p): n for p, n in sorted(self.nvlinks.items(), key=lambda x: name(x[0]))},
            "levels": {name(p): v for p, v in sorted(self.levels.items(), key=lambda x: name(x[0]))},
        }


def _direct(a: GpuLinks, b: GpuLinks) -> int:
    forward = a.gpu_peers.get(b.bus_id, 0)
    backward = b.gpu_peers.get(a.bus_id, 0)
    if forward != backward:
        # Links are bidirectional; a difference means one side could not read all of its links.
        log.warning("nvlink_counts_differ", gpus=[a.uuid, b.uuid], counts=[forward, backward])
    return min(forward, backward)


def read_links(nvml: Nvml) -> LinkMatrix:
    """The link matrix of every full GPU NVML lists (NVML already open). Never raises for one GPU.

    Raises:
        NvmlError: only when the GPUs cannot even be counted.
    """
    handles: dict[str, Any] = {}
    gpus: list[GpuLinks] = []
    for index in range(int(nvml.call("nvmlDeviceGetCount"))):
        try:
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            uuid = _text(nvml.call("nvmlDeviceGetUUID", handle))
            bus_id = normalize_pci_bus_id(_text(nvml.call("nvmlDeviceGetPciInfo", handle).busId))
        except NvmlError as exc:
            # Without its UUID a GPU cannot be named: it is not advertised either (discovery skips it).
            log.warning("gpu_links_unreadable", gpu=index, error=str(exc))
            continue
        try:
            gpu = _gpu_links(nvml, handle, uuid, bus_id)
        except NvmlError as exc:
            log.warning("gpu_links_lost", gpu=index, uuid=uuid, error=str(exc))
            gpu = GpuLinks(uuid=uuid, bus_id=bus_id, lost=True)
        else:
            handles[uuid] = handle
        gpus.append(gpu)
    levels: dict[frozenset[str], int] = {}
    for a, b in combinations(handles, 2):
        try:
            levels[frozenset((a, b))] = int(
                nvml.call("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
            )
        except NvmlError as exc:
            log.warning("topology_level_unreadable", gpus=[a, b], error=str(exc))
    matrix = LinkMatrix.build(gpus, levels)
    log.info(
        "link_matrix_read", gpus=len(matrix.gpus), nvlink_pairs=len(matrix.nvlinks), lost=len(matrix.lost)
    )
    return matrix


def _gpu_links(nvml: Nvml, handle: Any, uuid: str, bus_id: str) -> GpuLinks:
    switch_type = getattr(nvml.module, _SWITCH_TYPE_NAME, _SWITCH_TYPE_DEFAULT)
    max_links = int(getattr(nvml.module, "NVML_NVLINK_MAX_LINKS", 18))
    peers: Counter[str] = Counter()
    switches: Counter[str] = Counter()
    for link in range(max_links):
        try:
            state = nvml.call("nvmlDeviceGetNvLinkState", handle, link)
            if state != nvml.const("NVML_FEATURE_ENABLED"):
                continue
            remote = normalize_pci_bus_id(
                _text(nvml.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link).busId)
            )
        except NvmlError as exc:
            if exc.code in (_nvml.NOT_SUPPORTED, _nvml.INVALID_ARGUMENT):
                # No such link on this GPU (or no NVLink at all): upstream skips it too.
                continue
            if exc.code == _nvml.GPU_IS_LOST:
                raise
            log.warning("nvlink_unreadable", uuid=uuid, link=link, error=str(exc))
            continue
        if _remote_type(nvml, handle, link) == switch_type:
            switches[remote] += 1
        else:
            peers[remote] += 1
    return GpuLinks(uuid=uuid, bus_id=bus_id, gpu_peers=dict(peers), switches=dict(switches))


def _remote_type(nvml: Nvml, handle: Any, link: int) -> int | None:
    try:
        return int(nvml.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link))
    except NvmlError as exc:
        if exc.code == _nvml.GPU_IS_LOST:
            raise
        # Old drivers lack the call: the link is taken as GPU-to-GPU, as upstream does.
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
