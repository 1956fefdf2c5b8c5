"""tepo-verl: TEPO (Token-Level Policy Optimization) for verl.

`tepo_verl.core` is the pure-torch algorithm (no verl import); `tepo_verl.verl_adapter` wires it into verl and is
loaded in every verl process through the `verl.plugins` entry point. See README.md and docs/algorithm.md.
"""

__version__ = "0.1.0"
