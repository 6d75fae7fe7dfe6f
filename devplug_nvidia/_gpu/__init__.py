"""GPU access shared by both APIs: NVML, the GPU records, health, XIDs, NVLinks and the MPS daemon.

What a device plugin and a DRA driver both need of the GPUs themselves: the NVML wrapper
(:mod:`._nvml`), the records discovery makes (:mod:`._model`), the health monitor over NVML events
and its XID filter (:mod:`._health`, :mod:`._xids`), the NVLink matrix (:mod:`._links`) and the MPS
control daemon's commands and checks (:mod:`._mps`).

Rule: imports nothing else of ``devplug_nvidia``: neither API side, nor discovery, config or the
CLI. Everything else may build on it.
"""
