"""``devplug demo``: a fake kubelet and the fake plugin talking, told step by step (the
device-plugin story, and with ``--dra`` the DRA one).

Rule: it uses the library and the testing kit only through their public names; nothing but
``devplug.cli`` imports it.
"""
