"""The device-plugin service (``v1beta1.DevicePlugin`` through the kubelet's registration): private.

One runner per resource (socket, registration, the gRPC servicer, restart recovery), the service
that keeps the set of resources, and what it shows the probes and metrics. Built on
:mod:`devplug._runtime`.

Rule: never imports the DRA side (``devplug._dra``, ``devplug.dra``, the Kubernetes client),
the testing kit or the commands.
"""
