"""`python -m traces`."""

import sys

from traces.cli import main

if __name__ == "__main__":
    sys.exit(main())
