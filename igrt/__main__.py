"""`python -m igrt`."""

import sys

from igrt.cli import main

if __name__ == "__main__":
    sys.exit(main())
