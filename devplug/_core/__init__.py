"""The runtime: device state, the gRPC servicer, sockets, registration and lifecycle.

Private: nothing here is public API. ``_core`` never imports ``devplug.testing`` or a backend.
"""
