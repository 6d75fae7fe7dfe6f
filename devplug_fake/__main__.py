"""``python -m devplug_fake``."""

import sys

from devplug_fake import main

if __name__ == "__main__":
    sys.exit(main())
