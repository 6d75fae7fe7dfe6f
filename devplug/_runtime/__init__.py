"""The process runtime both Kubernetes APIs share: private.

What one node daemon needs whatever API it serves: signals, the probes and metrics port, the
watch on the kubelet's directories, unix-socket servers, back-off, the versioned device state and
the device feed, and the host that runs services (the device-plugin one, the DRA one, or both).

Rule: never imports a service (``devplug._device_plugin``, ``devplug._dra``), the testing kit,
the commands or the Kubernetes client; the services plug into it, not the other way.
"""
