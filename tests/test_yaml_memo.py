"""The suite's memos change no composition and no load: the YAML memo (tests/yaml_memo.py, installed by
tests/conftest.py) and the compositions that tests/verl_config.py:compose_config keeps."""

from __future__ import annotations

import omegaconf.omegaconf
import pytest
import verl_config
import yaml
import yaml_memo
from omegaconf import OmegaConf
from verl_config import compose_config


def test_it_is_installed_in_the_test_process():
    assert isinstance(omegaconf.omegaconf.yaml, yaml_memo._MemoYaml)


def _composed_afresh(overrides):
    """A composition by Hydra itself, past compose_config's kept compositions (command_line_config keeps none)."""
    return verl_config.command_line_config([*verl_config.BASE, *overrides])


def test_a_composition_with_the_memo_is_the_one_without_it(monkeypatch):
    overrides = ["+algorithm=tepo", "trainer.device=cpu"]
    _composed_afresh(overrides)  # the memo has seen every file
    with_memo = OmegaConf.to_yaml(_composed_afresh(overrides))
    monkeypatch.setattr(omegaconf.omegaconf, "yaml", yaml)
    assert with_memo == OmegaConf.to_yaml(_composed_afresh(overrides))


def test_a_kept_composition_is_a_fresh_one_and_a_change_to_it_reaches_no_later_call():
    overrides = ["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.kl_coef=0.5"]
    first = compose_config(overrides)
    first.actor_rollout_ref.actor.policy_loss.tepo.kl_coef = 9.0
    first.algorithm.adv_estimator = "changed"
    again = compose_config(overrides)
    assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(_composed_afresh(overrides))
    assert again.actor_rollout_ref.actor.policy_loss.tepo.kl_coef == 0.5
    assert OmegaConf.is_struct(again)  # as Hydra hands it out: an unknown key is refused
    with pytest.raises(Exception, match="not_a_key"):
        again.algorithm.not_a_key = 1


def test_other_config_sources_compose_afresh(tmp_path, monkeypatch):
    """A composition is kept per set of config sources: a source put before the shipped presets, with its own
    `algorithm/tepo.yaml`, changes what the same overrides compose."""
    from hydra.core.config_search_path import ConfigSearchPath
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    (tmp_path / "algorithm").mkdir()
    (tmp_path / "algorithm" / "tepo.yaml").write_text("# @package _global_\nalgorithm:\n  gamma: 0.5\n")

    class StandIn(SearchPathPlugin):
        def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
            search_path.prepend(provider="stand-in", path=f"file://{tmp_path}")

    assert compose_config(["+algorithm=tepo"]).algorithm.gamma == 1.0  # the shipped preset, kept
    registered = Plugins.instance().plugin_type_to_subclass_list[SearchPathPlugin]
    monkeypatch.setitem(Plugins.instance().plugin_type_to_subclass_list, SearchPathPlugin, [*registered, StandIn])
    assert compose_config(["+algorithm=tepo"]).algorithm.gamma == 0.5


def test_a_change_to_a_loaded_config_does_not_reach_the_next_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: {b: [1, 2]}\nc: 1.5e-3\n")
    first = OmegaConf.load(path)
    first.a.b.append(3)
    first.c = 0
    assert OmegaConf.to_container(OmegaConf.load(path)) == {"a": {"b": [1, 2]}, "c": 1.5e-3}


def test_an_edited_file_parses_afresh_and_bad_text_fails_each_time(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    assert OmegaConf.load(path).a == 1
    path.write_text("a: 2\n")
    assert OmegaConf.load(path).a == 2
    path.write_text("a: 1\na: 2\n")  # OmegaConf's loader refuses duplicate keys
    for _ in range(2):
        with pytest.raises(yaml.constructor.ConstructorError, match="found duplicate key a"):
            OmegaConf.load(path)
