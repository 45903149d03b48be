"""`python -m igpolicy`."""

import sys

from igpolicy.cli import main

if __name__ == "__main__":
    sys.exit(main())
