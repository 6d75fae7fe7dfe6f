"""The fake API server (``FakeKubeAPI``): HTTP, storage, watches, validation and the scheduler
stand-in of the testing kit.

Rule: it never imports the fake kubelets (``devplug.testing._kubelet``) nor the conformance
checks (``devplug.testing._conformance``), nor devplug's runtime; it needs the ``testing``
extra (h11, lightkube's models), and ``FakeKubeAPI.client()`` the ``dra`` extra.
"""
