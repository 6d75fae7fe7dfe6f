"""``python -m devplug``: the devplug command."""

import sys

from devplug.cli import main

sys.exit(main())
