"""Test device plugins against a fake kubelet that behaves like the real one.

``FakeKubelet`` serves ``v1beta1.Registration`` on a real unix socket, validates and answers
registrations with the kubelet's texts, dials plugins back, follows their ListAndWatch streams
and offers the calls the kubelet makes (Allocate, GetPreferredAllocation, PreStartContainer),
restarts and the plugin-watcher path. The pytest plugin (``devplug.testing.pytest_plugin``,
loaded automatically) adds a ``fake_kubelet`` fixture.

This package talks to plugins only over gRPC: it does not depend on devplug's runtime.
"""

from devplug.testing._kubelet import FakeKubelet
from devplug.testing._resource import Registration, ResourceView

__all__ = ["FakeKubelet", "Registration", "ResourceView"]
