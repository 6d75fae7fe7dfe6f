"""What a container is given for its GPUs, shared by both APIs: device nodes, mounts, environment, CDI.

The allocation NVIDIA's device plugin answers (:mod:`._allocate`), the CDI spec and the edits both
APIs write (:mod:`._cdi`) and the user-space driver files they mount (:mod:`._cdi_driver`). The DRA
driver's per-claim spec builds on these edits.

Rule: imports only :mod:`devplug_nvidia._gpu` and the public :mod:`devplug_nvidia.config`; never
either API side (device plugin or DRA), discovery or the CLI.
"""
