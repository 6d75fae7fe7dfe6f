"""The conformance checks: a plugin or DRA driver command run against a private fake kubelet
(and, for DRA, a fake API server), and the judges that read what was seen.

Rule: it uses the fake kubelets and the fake API server and never devplug's runtime; the DRA
session needs the ``testing`` extra.
"""
