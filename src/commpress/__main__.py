"""``python -m commpress``: the ``commpress`` command line."""

import sys

from commpress.cli import main

if __name__ == "__main__":
    sys.exit(main())
