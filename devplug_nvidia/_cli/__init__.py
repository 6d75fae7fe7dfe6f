"""The ``devplug-nvidia`` command: serving, its help text and fake roots for ``--fake-nvml``.

The entry point that wires discovery, config and either API together (:mod:`._main`), the help
and version text (:mod:`._help`) and the fake host trees of ``--fake-nvml MODEL`` and the
``fake-root`` command (:mod:`._fake_root`).

Rule: the top of the package: it may import anything; nothing imports it but the public front
(:mod:`devplug_nvidia`, :mod:`devplug_nvidia.labels`, ``__main__``).
"""
