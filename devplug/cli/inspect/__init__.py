"""``devplug inspect``: a device plugin's or DRA driver's socket, called as the kubelet would.

Rule: it talks to sockets over gRPC with the generated protobuf modules and the testing kit's
RPC helpers, never through devplug's runtime; nothing but ``devplug.cli`` imports it.
"""
