"""Hand-made discovery records shared by the NVIDIA tests."""

from __future__ import annotations

from devplug_nvidia._gpu._model import GpuRecord, MigInfo

G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-11111111-1111-1111-1111-111111111111"
M0 = "MIG-aaaaaaaa-0000-0000-0000-000000000000"


def gpu(i: int, uuid: str) -> GpuRecord:
    return GpuRecord(
        kind="gpu",
        index=str(i),
        uuid=uuid,
        minor=i,
        name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        bus_id=f"0000:{i:02x}:00.0",
        numa_node=i,
        compute_capability=(8, 0),
    )


MIG = GpuRecord(
    kind="mig",
    index="1:0",
    uuid=M0,
    minor=1,
    name="NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    memory_mib=4864,
    bus_id="0000:01:00.0",
    numa_node=None,
    compute_capability=(8, 0),
    mig=MigInfo(
        parent_uuid=G1,
        parent_index=1,
        parent_minor=1,
        gpu_instance_id=7,
        compute_instance_id=0,
        profile="1g.5gb",
        cap_paths=("/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"),
    ),
)
GPUS = [gpu(0, G0), gpu(1, G1)]
