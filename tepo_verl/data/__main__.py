"""`python -m tepo_verl.data ...` (see tepo_verl.data.cli)."""

import sys

from tepo_verl.data.cli import main

if __name__ == "__main__":
    sys.exit(main())
