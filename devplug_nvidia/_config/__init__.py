"""The private half of :mod:`devplug_nvidia.config`: the config file's schema and the feature gates.

The upstream config file (:mod:`._file`: flags, sharing, resources) and ``--feature-gates``
(:mod:`._feature_gates`).

Rule: pure: no NVML, no I/O beyond reading the file it is given, and imports nothing else of
``devplug_nvidia``.
"""
