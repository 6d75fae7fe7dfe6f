"""The private half of :mod:`devplug_nvidia.discovery`: what NVML says a node has.

Per-GPU details (:mod:`._details`), MIG capability minors and profile names (:mod:`._mig`) and the
MIG strategies that turn records into resources (:mod:`._strategy`).

Rule: imports only :mod:`devplug_nvidia._gpu`; never either API side, config or the CLI.
"""
