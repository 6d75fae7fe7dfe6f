"""The DRA node-driver runtime behind :mod:`devplug.dra`: private.

A layer beside the device-plugin runtime (:mod:`devplug._core`), sharing its device feed,
versioned state, sockets, directory watcher and back-off, and :mod:`devplug.cdi`. Pure parts
(``names``, ``slices``, ``inventory``) do no I/O; ``kube`` is the only module that talks to the
API server's client library, ``servicer`` the only one that touches protobuf.
"""
