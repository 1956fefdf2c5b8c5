"""Comparison report over verl `file`-logger runs: `tepo-verl compare RUN ...` (see compare.py)."""
