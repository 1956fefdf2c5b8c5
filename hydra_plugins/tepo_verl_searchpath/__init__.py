"""Hydra search-path plugin: adds tepo-verl's config groups (the `algorithm/` presets) to every Hydra app."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class TepoVerlSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Idempotent: Hydra's plugin scan and the plugin's direct registration may both run it.
        if not any(element.provider == "tepo-verl" for element in search_path.get_path()):
            search_path.append(provider="tepo-verl", path="pkg://tepo_verl.config")
