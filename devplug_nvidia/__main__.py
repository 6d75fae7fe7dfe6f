"""``devplug-nvidia`` / ``python -m devplug_nvidia``."""

from __future__ import annotations

from devplug_nvidia import main

if __name__ == "__main__":
    raise SystemExit(main())
