"""The thin layer between the pure TEPO core and verl 0.9 (registries, actor-loss adapter, config, Hydra presets).

Loaded in every verl process by the `verl.plugins` entry point (`tepo_verl.verl_adapter.plugin:load`).
"""
