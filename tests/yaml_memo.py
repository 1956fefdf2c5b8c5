"""Parse each distinct YAML text once per test process.

Composing verl's config reads about 30 YAML files through `OmegaConf.load`, and the suite composes it some hundred
times in each pytest process: PyYAML's pure-Python parser then takes about 40% of every composition. `install()`
hands OmegaConf a `yaml` whose `load` keeps the parse of each text it has seen (keyed by the whole text, so an edited
file parses afresh). Its one caller, `OmegaConf.load`, builds a new config from the parse and keeps no part of it, so
no change to a loaded config reaches a later load (tests/test_yaml_memo.py). The parser is
OmegaConf's own loader, unchanged; a text that fails to parse is not kept and fails again on the next call.
"""

from __future__ import annotations

import omegaconf.omegaconf
import yaml

_PARSED: dict[tuple[str, str], object] = {}  # (loader's name, text) -> its parse


def _parsed(text: str, loader: type) -> object:
    # OmegaConf builds its loader class afresh on every call (get_yaml_loader), always the same: key it by name
    key = (f"{loader.__module__}.{loader.__qualname__}", text)
    if key not in _PARSED:
        _PARSED[key] = yaml.load(text, Loader=loader)
    return _PARSED[key]


class _MemoYaml:
    """The `yaml` module as `omegaconf.omegaconf` sees it, with `load` kept per text."""

    def __getattr__(self, name: str):
        return getattr(yaml, name)

    @staticmethod
    def load(stream, Loader):  # noqa: N803  (yaml.load's own keyword)
        text = stream if isinstance(stream, str) else stream.read()
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return _parsed(text, Loader)


def install() -> None:
    """From now on in this process, OmegaConf.load (and so Hydra) parses each distinct text once."""
    omegaconf.omegaconf.yaml = _MemoYaml()
