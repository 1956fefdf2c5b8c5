"""The `tepo-verl` dispatcher reaches every tool; unknown commands name the valid ones."""

import importlib

import pytest

from tepo_verl.cli import COMMANDS, main


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_resolves_to_a_main(name):
    module, function = COMMANDS[name][0].split(":")
    assert callable(getattr(importlib.import_module(module), function))


@pytest.mark.parametrize("name", ["demo", "data", "eval", "compare", "tiny", "doctor"])
def test_help_of_each_command(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_unknown_command(capsys):
    assert main(["train"]) == 2
    valid = "demo, data, eval, compare, tiny, cpu-check, doctor"
    assert f"unknown command 'train'; valid: {valid}" in capsys.readouterr().err
    assert main([]) == 0


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
    code = main(["tiny", "build", "--out", str(tmp_path / "t"), "--print", "weights"])
    _one_line_error(capsys, code, 2, "error: unknown --print field 'weights'; valid: model, train")


def test_cpu_check_bad_argument(capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage line + one error line, exit 2
        main(["cpu-check", "--fast"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --fast" in capsys.readouterr().err


def test_cpu_check_vllm_that_does_not_import(monkeypatch, capsys):
    import sys

    from tepo_verl.cpu import versions

    monkeypatch.setattr(versions, "installed_versions",
                        lambda names=None: {name: accepted[-1] for name, accepted in versions.REQUIRED.items()})
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    _one_line_error(capsys, main(["cpu-check"]), 1, "error: vllm does not import: ModuleNotFoundError",
                    "install_cpu.sh")


def test_cpu_check_mismatched_stack(monkeypatch, capsys):
    from tepo_verl.cpu import versions

    monkeypatch.setattr(versions, "installed_versions",
                        lambda names=None: {**{name: accepted[-1] for name, accepted in versions.REQUIRED.items()},
                                            "verl": "0.8.0"})
    assert main(["cpu-check"]) == 1
    assert "verl: installed 0.8.0, required 0.9.0 or 0.9.1" in capsys.readouterr().err


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
