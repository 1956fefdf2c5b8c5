"""The `tepo-verl` dispatcher reaches every tool; unknown commands name the valid ones."""

import importlib

import pytest

from tepo_verl.cli import COMMANDS, main


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_resolves_to_a_main(name):
    module, function = COMMANDS[name][0].split(":")
    assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize("name", ["data", "eval", "compare", "tiny"])
def test_help_of_each_command(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_unknown_command(capsys):
    assert main(["train"]) == 2
    assert "unknown command 'train'; valid: data, eval, compare, tiny, cpu-check" in capsys.readouterr().err
    assert main([]) == 0
