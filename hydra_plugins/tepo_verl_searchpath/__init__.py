"""Hydra search-path plugin: adds tepo-verl's config groups (the `algorithm/` presets) to every Hydra app."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class TepoVerlSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="tepo-verl", path="pkg://tepo_verl.config")
