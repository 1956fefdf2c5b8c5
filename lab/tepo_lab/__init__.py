"""tepo-verl's lab, apart from the plugin: the CPU mode (cpu/), the tiny models and tasks (tiny/), the demo.

It imports the plugin (tepo_verl); the plugin never imports it. `make` installs both (docs/cpu-mode.md).
"""
