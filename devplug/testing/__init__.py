"""Test device plugins against a fake kubelet that behaves like the real one.

``FakeKubelet`` serves ``v1beta1.Registration`` on a real unix socket, validates and answers
registrations with the kubelet's texts, dials plugins back, follows their ListAndWatch streams
and offers the calls the kubelet makes (Allocate, GetPreferredAllocation, PreStartContainer),
restarts and the plugin-watcher path. It serves the kubelet's pod-resources API (v1
``PodResourcesLister``) too, listing the pods a test names (:class:`PodRef`) with what it
allocated and prepared for them. With ``dra=True`` it is also the kubelet's DRA manager:
DRA drivers register through the plugin watcher, and the kubelet's NodePrepareResources,
NodeUnprepareResources and health stream are offered, with the ResourceSlice wipes of a
:class:`FakeKubeAPI`. The pytest plugin (``devplug.testing.pytest_plugin``,
loaded automatically) adds a ``fake_kubelet`` fixture, and for DRA drivers ``fake_kube_api`` and
``fake_dra_kubelet``; :func:`serving` runs a plugin in the background of a test against the
first, :func:`serving_dra` runs it as a DRA driver against the other two, :func:`serving_both`
through both APIs at once.
:func:`run_conformance` runs a plugin command against a private fake kubelet and checks what the
kubelet relies on; :func:`run_dra_conformance` does the same for a DRA driver.

Apart from the three serving helpers, this package talks to plugins only over
gRPC: it does not depend on devplug's runtime, so it tests plugins written with anything.
"""

import typing

from devplug._lazy import lazy_names as _lazy_names

if typing.TYPE_CHECKING:
    from devplug.testing._kubeapi.faults import Fault, RecordedRequest
    from devplug.testing._kubeapi.scheduler import AllocationError
    from devplug.testing._kubeapi.server import FakeKubeAPI
    from devplug.testing._kubelet.dra_resource import (
        ClaimDevice,
        ClaimResult,
        DraInstance,
        DraRegistration,
        HealthReport,
    )
    from devplug.testing._kubelet.kubelet import FakeKubelet
    from devplug.testing._kubelet.pods import PodRef
    from devplug.testing._kubelet.resource import Registration, ResourceView
    from devplug.testing._serving import serving, serving_both, serving_dra
    from devplug.testing.conformance import (
        CHECKS,
        DRA_CHECKS,
        CheckResult,
        CheckStatus,
        ConformanceReport,
        run_conformance,
        run_dra_conformance,
    )

__all__ = [
    "CHECKS",
    "DRA_CHECKS",
    "AllocationError",
    "CheckResult",
    "CheckStatus",
    "ClaimDevice",
    "ClaimResult",
    "ConformanceReport",
    "DraInstance",
    "DraRegistration",
    "FakeKubeAPI",
    "FakeKubelet",
    "Fault",
    "HealthReport",
    "PodRef",
    "RecordedRequest",
    "Registration",
    "ResourceView",
    "run_conformance",
    "run_dra_conformance",
    "serving",
    "serving_both",
    "serving_dra",
]

_HOMES = {
    **dict.fromkeys(
        ("ClaimDevice", "ClaimResult", "DraInstance", "DraRegistration", "HealthReport"),
        "devplug.testing._kubelet.dra_resource",
    ),
    "FakeKubeAPI": "devplug.testing._kubeapi.server",
    "Fault": "devplug.testing._kubeapi.faults",
    "RecordedRequest": "devplug.testing._kubeapi.faults",
    "AllocationError": "devplug.testing._kubeapi.scheduler",
    "FakeKubelet": "devplug.testing._kubelet.kubelet",
    "PodRef": "devplug.testing._kubelet.pods",
    "Registration": "devplug.testing._kubelet.resource",
    "ResourceView": "devplug.testing._kubelet.resource",
    "serving": "devplug.testing._serving",
    "serving_both": "devplug.testing._serving",
    "serving_dra": "devplug.testing._serving",
    **dict.fromkeys(
        (
            "CHECKS",
            "DRA_CHECKS",
            "CheckResult",
            "CheckStatus",
            "ConformanceReport",
            "run_conformance",
            "run_dra_conformance",
        ),
        "devplug.testing.conformance",
    ),
}
# The fake API server and what is built on it need the testing extra (h11, lightkube's models).
_EXTRAS = dict.fromkeys(
    ("FakeKubeAPI", "Fault", "RecordedRequest", "AllocationError"),
    "testing",
)

if not typing.TYPE_CHECKING:  # type checkers read the imports above
    __getattr__, __dir__ = _lazy_names(__name__, _HOMES, __all__, _EXTRAS)
