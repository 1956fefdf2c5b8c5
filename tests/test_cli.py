"""The `tepo-verl` and `tepo-lab` dispatchers reach every tool; unknown commands name the valid ones, and the
plugin's command names where the lab's commands run."""

import importlib

import pytest

from tepo_lab.cli import COMMANDS as LAB_COMMANDS
from tepo_lab.cli import main as lab_main
from tepo_verl.cli import COMMANDS, main


@pytest.mark.parametrize("commands, name", [(COMMANDS, name) for name in COMMANDS]
                         + [(LAB_COMMANDS, name) for name in LAB_COMMANDS])
def test_every_command_resolves_to_a_main(commands, name):
    module, function = commands[name][0].split(":")
    assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize("entry, name", [(main, "data"), (main, "eval"), (main, "compare"), (main, "doctor"),
                                         (lab_main, "demo"), (lab_main, "tiny"), (lab_main, "cpu-check")])
def test_help_of_each_command(entry, name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        entry([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_unknown_command(capsys):
    assert main(["train"]) == 2
    assert "tepo-verl: unknown command 'train'; valid: data, eval, compare, doctor\n" in capsys.readouterr().err
    assert main([]) == 0
    assert lab_main(["train"]) == 2
    assert "tepo-lab: unknown command 'train'; valid: demo, tiny, cpu-check\n" in capsys.readouterr().err


@pytest.mark.parametrize("name, where", [("demo", "`make demo`"), ("tiny", "`tepo-lab tiny`"),
                                         ("cpu-check", "`tepo-lab cpu-check`")])
def test_the_plugin_says_in_one_line_where_the_labs_commands_run(name, where, capsys):
    """The plugin carries no lab command; each is `tepo-lab`'s, and `tepo-verl NAME` says where to run it."""
    assert name in LAB_COMMANDS and name not in COMMANDS
    assert main([name, "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name!r} is a command of the CPU lab" in err and where in err, err
    assert "in a checkout of tepo-verl" in err


# ---- every command fails cleanly: one line on stderr, a non-zero exit, never a traceback -------------------------

def _one_line_error(capsys, code, expected_code, *fragments):
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["convert", "nosuch", "--out-dir", "{tmp}/o"], ["unknown data set 'nosuch'; valid: dapo_math_17k"]),
        (["convert", "aime24", "--template", "fancy", "--out-dir", "{tmp}/o"], ["'fancy'; valid: qwen_math"]),
        (["convert", "aime24", "--limit", "0", "--out-dir", "{tmp}/o"], ["--limit must be >= 1, got 0"]),
        (["convert", "aime24", "--offline", "--out-dir", "{tmp}/file"], ["{tmp}/file is a file, not a folder"]),
        (["convert", "aime24", "--local-dir", "{tmp}/nothing", "--out-dir", "{tmp}/o"], ["is not a folder"]),
        (["convert", "aime24", "--local", "aime24={tmp}/corrupt.parquet", "--out-dir", "{tmp}/o"], ["corrupt.parquet"]),
        (["convert", "aime24", "--local", "aime24={tmp}/corrupt.jsonl", "--out-dir", "{tmp}/o"], ["not a JSON line"]),
        (["contamination", "--train", "{tmp}/missing.parquet", "--eval", "{tmp}/missing.parquet"], ["not found"]),
        (["contamination", "--train", "{tmp}/corrupt.parquet", "--eval", "{tmp}/corrupt.parquet"], ["corrupt.parquet"]),
    ],
)
def test_data_bad_input(argv, fragments, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "corrupt.parquet").write_text("not parquet")
    (tmp_path / "corrupt.jsonl").write_text("{oops\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _one_line_error(capsys, main(["data", *argv]), 2, "error: ",
                    *[f.replace("{tmp}", str(tmp_path)) for f in fragments])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["{tmp}/missing.jsonl"], ["generations file or folder not found"]),
        (["{tmp}/empty"], ["no .jsonl files in"]),
        (["{tmp}/corrupt.jsonl"], ["corrupt.jsonl:1: not a JSON line"]),
        (["{tmp}/ok.jsonl", "--threads", "0"], ["--threads must be >= 1, got 0"]),
        (["{tmp}/ok.jsonl", "--timeout", "0"], ["--timeout must be a positive number of seconds, got 0.0"]),
        (["{tmp}/ok.jsonl", "--k", "0"], ["--k values must be >= 1"]),
        (["{tmp}/ok.jsonl", "--out-dir", "{tmp}/file"], ["is a file, not a folder"]),
        (["{tmp}/ok.jsonl", "--datasets", "{tmp}/corrupt.parquet"], ["corrupt.parquet"]),
        (["{tmp}/ok.jsonl", "--step", "7"], ["no samples of step 7"]),
    ],
)
def test_eval_bad_input(argv, fragments, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "corrupt.parquet").write_text("not parquet")
    (tmp_path / "corrupt.jsonl").write_text("{oops\n")
    (tmp_path / "ok.jsonl").write_text('{"data_source": "t", "output": "\\\\boxed{1}", "gts": "1", "step": 3}\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _one_line_error(capsys, main(["eval", *argv, "--no-progress"]), 2, "error: ", *fragments)


def test_eval_good_input_still_works(tmp_path, capsys):
    (tmp_path / "ok.jsonl").write_text('{"data_source": "t", "output": "\\\\boxed{1}", "gts": "1", "step": 3}\n')
    assert main(["eval", str(tmp_path / "ok.jsonl"), "--no-progress", "--isolation", "inline"]) == 0
    assert "1 samples graded" in capsys.readouterr().out


def test_tiny_bad_input(tmp_path, capsys):
    code = lab_main(["tiny", "build", "--out", str(tmp_path / "t"), "--print", "weights"])
    _one_line_error(capsys, code, 2, "error: unknown --print field 'weights'; valid: model, train")


def test_cpu_check_bad_argument(capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage line + one error line, exit 2
        lab_main(["cpu-check", "--fast"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --fast" in capsys.readouterr().err


def _the_tested_stack() -> dict[str, str]:
    """The CPU stack's versions as cpu-check wants them (the last accepted version of each)."""
    from tepo_lab.cpu import versions

    return {name: accepted[-1] for name, accepted in versions.REQUIRED.items()}


def test_cpu_check_vllm_that_does_not_import(monkeypatch, capsys):
    import sys

    from tepo_lab.cpu import versions

    monkeypatch.setattr(versions, "installed_versions", lambda names=None: _the_tested_stack())
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    monkeypatch.setattr(versions, "hook_problem", lambda entry_points=None, environ=None: None)
    _one_line_error(capsys, lab_main(["cpu-check"]), 1, "error: vllm does not import: ModuleNotFoundError",
                    "install_cpu.sh")


def test_cpu_check_mismatched_stack(monkeypatch, capsys):
    from tepo_lab.cpu import versions

    monkeypatch.setattr(versions, "installed_versions", lambda names=None: {**_the_tested_stack(), "verl": "0.8.0"})
    assert lab_main(["cpu-check"]) == 1
    assert "verl: installed 0.8.0, required 0.9.0 or 0.9.1" in capsys.readouterr().err


def test_cpu_check_without_the_labs_entry_point(monkeypatch, capsys):
    from tepo_lab.cpu import versions

    monkeypatch.setattr(versions, "installed_versions", lambda names=None: _the_tested_stack())
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "tepo")
    _one_line_error(capsys, lab_main(["cpu-check"]), 1, "error: VERL_USE_EXTERNAL_PLUGINS='tepo' keeps verl from "
                    "loading the CPU mode's entry point 'tepo_cpu'")


def test_unexpected_errors_become_one_line(monkeypatch, capsys):
    import sys
    import types

    from tepo_verl import cli

    def boom(argv):
        raise KeyError("surprise\nsecond line")

    monkeypatch.setitem(sys.modules, "tepo_test_boom", types.SimpleNamespace(main=boom))
    monkeypatch.setitem(cli.COMMANDS, "boom", ("tepo_test_boom:main", "raises"))
    _one_line_error(capsys, main(["boom"]), 1, "tepo-verl boom: error: KeyError", "TEPO_VERL_DEBUG=1")
    monkeypatch.setenv("TEPO_VERL_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["boom"])


def test_console_script_prints_no_traceback(tmp_path):
    """The installed entry point end to end, in a fresh interpreter."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tepo_verl.cli", "data", "convert", "nosuch", "--out-dir",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown data set 'nosuch'") and "Traceback" not in proc.stderr


def test_cpu_check_without_the_import_check_leaves_vllm_alone(monkeypatch, capsys):
    """`--no-import` (what recipes/cpu.sh runs before each run) checks the versions and the entry point, not vllm's
    import, and says so."""
    import sys

    from tepo_lab.cpu import versions

    monkeypatch.setattr(versions, "installed_versions", lambda names=None: _the_tested_stack())
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` would raise ImportError
    monkeypatch.setattr(versions, "hook_problem", lambda entry_points=None, environ=None: None)
    assert lab_main(["cpu-check", "--no-import"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ok: the tested CPU stack is installed and verl loads the CPU mode's entry point (vllm's import not checked: "
        "--no-import)")
    # the versions are still checked
    monkeypatch.setattr(versions, "installed_versions", lambda names=None: {**_the_tested_stack(), "verl": "0.8.0"})
    assert lab_main(["cpu-check", "--no-import"]) == 1
    assert "verl: installed 0.8.0, required 0.9.0 or 0.9.1" in capsys.readouterr().err
