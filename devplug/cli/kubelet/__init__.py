"""``devplug kubelet``: a fake kubelet (and with ``--dra`` its API server) for plugins to
register with, printing what it learns.

Rule: it runs the testing kit's fakes through their public names; nothing but ``devplug.cli``
imports it.
"""
