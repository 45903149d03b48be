"""`python -m igsim`."""

import sys

from igsim.cli import main

if __name__ == "__main__":
    sys.exit(main())
