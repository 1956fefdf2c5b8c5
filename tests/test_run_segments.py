"""A resumed run's metrics segments (tepo_verl/report/runs.py): the recipes keep each segment before verl's file
logger truncates its file, and `tepo-verl compare` reads them as one run ordered by step, the later segment winning."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tepo_verl.report.runs import (
    RunError,
    keep_segments,
    load_run,
    load_runs,
    parse_run_spec,
    segments,
    will_resume,
)
from tepo_verl.report.runs import main as runs_main


def write(path: Path, records: list[tuple[int, dict]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in records))
    return path


VAL = "val-core/tiny/acc/mean@1"


def test_resuming_moves_the_file_aside_as_the_next_segment_and_a_fresh_start_drops_them(tmp_path):
    metrics = tmp_path / "tepo-seed1" / "metrics.jsonl"
    write(metrics, [(0, {VAL: 0.1}), (1, {"critic/score/mean": 0.2})])
    assert "kept the metrics so far as metrics.segment-1.jsonl" in keep_segments(metrics, resuming=True)
    assert not metrics.exists() and segments(metrics) == [metrics.with_name("metrics.segment-1.jsonl")]
    write(metrics, [(1, {"critic/score/mean": 0.3})])
    keep_segments(metrics, resuming=True)
    write(metrics, [(2, {"critic/score/mean": 0.4})])
    assert [p.name for p in segments(metrics)] == ["metrics.segment-1.jsonl", "metrics.segment-2.jsonl",
                                                  "metrics.jsonl"]
    assert keep_segments(metrics.with_name("other.jsonl"), resuming=True) is None  # nothing to keep
    # a fresh start in the same folder replaces the run: its old segments must not join the new one
    assert "removed 2 earlier segment(s)" in keep_segments(metrics, resuming=False)
    assert segments(metrics) == [metrics]


def test_segments_read_as_one_run_ordered_by_step_the_later_segment_winning(tmp_path):
    run = tmp_path / "tepo-seed1"
    # segment 1: validated at 0, trained 1-3, stopped after logging step 3; its checkpoint is at step 2
    write(run / "metrics.segment-1.jsonl", [(0, {VAL: 0.1}), (1, {"critic/score/mean": 0.1}),
                                            (2, {"critic/score/mean": 0.2, "actor/pg_clipfrac": 0.5}),
                                            (3, {"critic/score/mean": 0.3})])
    # segment 2 resumes from step 2: validates there again, recomputes 3, goes on to 4
    write(run / "metrics.jsonl", [(2, {VAL: 0.25}), (4, {"critic/score/mean": 0.45, VAL: 0.5}),
                                  (3, {"critic/score/mean": 0.35})])
    loaded = load_run(run / "metrics.jsonl")
    assert list(loaded.metrics) == [0, 1, 2, 3, 4]  # each step once, in order
    assert loaded.metrics[2] == {"critic/score/mean": 0.2, "actor/pg_clipfrac": 0.5, VAL: 0.25}
    assert loaded.metrics[3] == {"critic/score/mean": 0.35}  # the recomputed step wins
    assert loaded.val_accuracy() == [(0, 0.1), (2, 0.25), (4, 0.5)]
    # a folder gives one run (not one per segment), and so does a segment's own path
    assert parse_run_spec(str(tmp_path)) == [(None, run / "metrics.jsonl")]
    assert parse_run_spec(str(run / "metrics.segment-1.jsonl")) == [(None, run / "metrics.jsonl")]
    assert [r.label for r in load_runs([str(tmp_path)])] == ["tepo"]


def test_segments_of_a_run_whose_latest_segment_never_started(tmp_path):
    """The recipe moved the file aside and the resumed run failed before verl opened a new one."""
    run = tmp_path / "grpo-seed2"
    write(run / "metrics.segment-1.jsonl", [(1, {"critic/score/mean": 0.1})])
    assert parse_run_spec(str(tmp_path)) == [(None, run / "metrics.jsonl")]
    assert list(load_run(run / "metrics.jsonl").metrics) == [1]


def compress(path: Path) -> Path:
    """PATH replaced by PATH.gz, its gzip-compressed copy."""
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


def test_compressed_segments_read_as_the_plain_ones(tmp_path):
    """A resumed run kept compressed, whole or in part, reads as the same run, its segments in order."""
    plain = tmp_path / "plain" / "tepo-seed1"
    write(plain / "metrics.segment-1.jsonl", [(0, {VAL: 0.1}), (1, {"critic/score/mean": 0.1})])
    write(plain / "metrics.segment-2.jsonl", [(1, {"critic/score/mean": 0.15}), (2, {"critic/score/mean": 0.2})])
    write(plain / "metrics.jsonl", [(2, {VAL: 0.3}), (3, {"critic/score/mean": 0.35})])
    expected = load_run(plain / "metrics.jsonl").metrics
    whole = ["metrics.segment-1.jsonl", "metrics.segment-2.jsonl", "metrics.jsonl"]
    for how, kept in (("part", whole[:1]), ("whole", whole)):
        run = tmp_path / how / "tepo-seed1"
        run.mkdir(parents=True)
        for path in plain.iterdir():
            (run / path.name).write_bytes(path.read_bytes())
        packed = [compress(run / name) for name in kept]
        latest = run / ("metrics.jsonl.gz" if "metrics.jsonl" in kept else "metrics.jsonl")
        assert parse_run_spec(str(run.parent)) == [(None, latest)]  # one run, named by its latest segment
        assert parse_run_spec(str(packed[0])) == [(None, latest)]
        assert [p.name for p in segments(latest)] == [name + (".gz" if name in kept else "") for name in whole]
        assert load_run(latest).metrics == expected
    write(run / "metrics.segment-1.jsonl", [(0, {VAL: 0.1})])  # segment 1 there twice: which one is meant?
    with pytest.raises(RunError, match="segment 1 of run .* is there twice: metrics.segment-1.jsonl and "
                                       "metrics.segment-1.jsonl.gz: keep one"):
        load_run(latest)


def _checkpoint(folder: Path, step: int) -> None:
    (folder / f"global_step_{step}").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_will_resume_as_verl_decides(tmp_path):
    ckpt = tmp_path / "checkpoints"
    assert not will_resume(ckpt, [])  # resume_mode=auto, nothing saved yet
    _checkpoint(ckpt, 2)
    assert will_resume(ckpt, [])
    assert not will_resume(ckpt, ["trainer.resume_mode=disable"])
    assert will_resume(ckpt, ["trainer.resume_mode=disable", "trainer.resume_mode=auto"])  # the last one wins
    assert not will_resume(ckpt, [f"trainer.default_local_dir={tmp_path / 'elsewhere'}"])
    assert will_resume(tmp_path / "none", ["trainer.resume_mode=resume_path",
                                           f"trainer.resume_from_path={ckpt}/global_step_2"])


def test_the_recipes_command(tmp_path, capsys):
    """What the recipes run before verl's trainer (`python -m tepo_verl.report.runs keep-segments ...`, in
    recipes/common.sh and recipes/cpu.sh; the legacy trainer's resumed end-to-end run runs it through cpu.sh),
    beside a checkpoint verl resumes from."""
    metrics = write(tmp_path / "run" / "metrics.jsonl", [(1, {"critic/score/mean": 0.1})])
    ckpt = tmp_path / "run" / "checkpoints"
    _checkpoint(ckpt, 1)
    assert runs_main(["keep-segments", str(metrics), str(ckpt), "algorithm=tepo"]) == 0
    assert capsys.readouterr().out == (f"[tepo-verl] {metrics}: resuming: kept the metrics so far as "
                                       "metrics.segment-1.jsonl (tepo-verl compare reads the segments as one run)\n")
    assert segments(metrics) == [metrics.with_name("metrics.segment-1.jsonl")]


def test_the_recipes_command_on_a_first_start_and_on_leftovers(tmp_path, capsys):
    """A first start (no metrics, no segment) changes nothing and says nothing, even beside a checkpoint; segments
    left without their latest file belong to a run that a fresh start replaces, and are removed."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints"
    _checkpoint(ckpt, 1)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert runs_main(["keep-segments", str(run / "metrics.jsonl"), str(ckpt)]) == 0
    assert capsys.readouterr().out == ""
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    leftover = write(run / "metrics.segment-1.jsonl", [(1, {"critic/score/mean": 0.1})])
    assert runs_main(["keep-segments", str(run / "metrics.jsonl"), str(ckpt), "trainer.resume_mode=disable"]) == 0
    assert capsys.readouterr().out == (f"[tepo-verl] {run / 'metrics.jsonl'}: fresh start: removed 1 earlier "
                                       "segment(s) of the run it replaces\n")
    assert not leftover.exists()
