"""Imported by verl's plugin discovery (`import verl` does `entry_point.load()`, which imports this module but
calls nothing), so importing it is what loads TEPO."""

from tepo_verl.verl_adapter.plugin import load

load()
