"""`python -m tepo_verl.evaluation ...` (see tepo_verl.evaluation.cli)."""

import sys

from tepo_verl.evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
