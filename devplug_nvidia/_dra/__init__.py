"""The DRA side: the private half of :mod:`devplug_nvidia.dra`.

The devices announced in ResourceSlices (:mod:`._devices`), the claim's CDI spec (:mod:`._cdi`),
the opaque configs of a claim and their grouping (:mod:`._config`, :mod:`._groups`), time-slicing
and MPS for claims (:mod:`._sharing`, :mod:`._mps`), dynamic MIG (:mod:`._dynamic`) and health as
device taints (:mod:`._health`).

Rule: never imports the device-plugin side (:mod:`devplug_nvidia._device_plugin`,
:mod:`devplug_nvidia.plugin`) nor the CLI.
"""
