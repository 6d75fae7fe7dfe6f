"""The device-plugin side: preferred allocation and shared (replicated) resources.

What only :mod:`devplug_nvidia.plugin` uses: the preferred-allocation policy over the NVLink
matrix (:mod:`._preferred`) and time-slicing / MPS replicas of the config's ``sharing``
(:mod:`._sharing`).

Rule: never imports the DRA side (:mod:`devplug_nvidia._dra`, :mod:`devplug_nvidia.dra`) nor the
CLI.
"""
