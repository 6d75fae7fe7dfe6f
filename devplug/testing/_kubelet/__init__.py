"""The fake kubelets: the device manager (Register, ListAndWatch, Allocate) and the DRA manager
(plugin watcher, NodePrepareResources, health), side by side, as kubelet 1.37 has them.

Rule: it talks to plugins only over gRPC and never imports devplug's runtime nor the
conformance checks; the fake API server is used only through the object a test passes in
(imported for type checking only), so it needs no extra.
"""
