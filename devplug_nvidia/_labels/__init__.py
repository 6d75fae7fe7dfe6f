"""The private half of :mod:`devplug_nvidia.labels`: gpu-feature-discovery's node labels.

:mod:`._node_labels` computes the labels from discovery's records and the config, and writes the
features file atomically.

Rule: imports GPU access, discovery and config; never either API side nor the CLI.
"""
