"""The DRA node-driver runtime behind :mod:`devplug.dra`: private.

A service beside the device-plugin one (:mod:`devplug._device_plugin`), both on the shared
runtime (:mod:`devplug._runtime`: device feed, versioned state, sockets, directory watcher,
back-off), and :mod:`devplug.cdi`. Pure parts
(``names``, ``slices``, ``inventory``, ``allocation``: a claim's allocation as typed records,
parsed once where the claim is read) do no I/O; ``kube`` is the only module that talks to the
API server's client library, ``servicer`` the only one that touches protobuf.

Rule: never imports the device-plugin service, the testing kit or the commands.
"""
