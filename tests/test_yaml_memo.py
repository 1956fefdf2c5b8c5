"""The suite's YAML memo (tests/yaml_memo.py, installed by tests/conftest.py) changes no composition and no load."""

from __future__ import annotations

import omegaconf.omegaconf
import pytest
import yaml
import yaml_memo
from omegaconf import OmegaConf
from verl_config import compose_config


def test_it_is_installed_in_the_test_process():
    assert isinstance(omegaconf.omegaconf.yaml, yaml_memo._MemoYaml)


def test_a_composition_with_the_memo_is_the_one_without_it(monkeypatch):
    overrides = ["+algorithm=tepo", "trainer.device=cpu"]
    compose_config(overrides)  # the memo has seen every file
    with_memo = OmegaConf.to_yaml(compose_config(overrides))
    monkeypatch.setattr(omegaconf.omegaconf, "yaml", yaml)
    assert with_memo == OmegaConf.to_yaml(compose_config(overrides))


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
