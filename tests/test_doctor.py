"""`tepo-verl doctor` on the committed CPU runs (plain and compressed alike), on synthetic GPU-like runs with a real
composed verl config, and on broken input (a half-written last line, bad paths, a bad record, a bad gzip stream)."""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl_config import compose_config

from tepo_verl.cli import main as cli_main
from tepo_verl.report import doctor
from tepo_verl.report.runs import metrics_file, open_metrics
from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES, precision_warning

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "cpu-scratchpad"


DOC_LINK = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")


def heading_anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives the Markdown headings of `doc`: lower case, punctuation dropped, spaces to hyphens."""
    headings = (line.lstrip("#").strip() for line in doc.read_text(encoding="utf-8").splitlines()
                if line.startswith("#"))
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def run_doctor(capsys, *argv) -> tuple[int, dict[str, str]]:
    """Exit code and {check name: its line} from the CLI; every docs link the doctor prints names a heading."""
    code = cli_main(["doctor", *map(str, argv)])
    out = capsys.readouterr().out.splitlines()
    lines = {line.split("] ", 1)[1].split(":", 1)[0]: line for line in out if line.startswith("[")}
    for doc, anchor in DOC_LINK.findall("\n".join(out)):
        assert anchor in heading_anchors(REPO / "docs" / doc), f"docs/{doc}#{anchor}"
    return code, lines


def status(line: str) -> str:
    return line[1:line.index("]")]


def committed_lines(folder: Path) -> list[str]:
    """The lines of a committed run's metrics (kept compressed: metrics.jsonl.gz)."""
    with open_metrics(metrics_file(folder)) as handle:
        return handle.read().splitlines()


def committed(name: str) -> list[dict]:
    return [json.loads(line)["data"] for line in committed_lines(RUNS / name)]


# ---- the committed CPU runs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, tepo", [("tepo-seed1", True), ("tepo-mask_old-seed1", True), ("gspo-seed1", False),
                                        ("grpo-seed1", False), ("dapo-seed1", False), ("gspo-fp32-seed1", False)])
def test_committed_cpu_runs(name, tepo, capsys):
    record = json.loads((RUNS / name / "run.json").read_text())
    fp32 = any("param_dtype:fp32" in o for o in record["overrides"])
    gspo_scale = record["preset"] in ("tepo", "gspo")
    code, lines = run_doctor(capsys, RUNS / name)
    assert len(lines) == len(doctor.CHECKS)
    # the CPU actor's log-probs are bf16 unless the run asked for float32; bf16 cannot resolve a 3e-4/4e-4 clip
    dtype = lines["log-prob dtype"]
    assert ("float32" if fp32 else "bfloat16") in dtype
    assert status(dtype) == ("FAIL" if gspo_scale and not fp32 else "ok")
    if status(dtype) == "FAIL":
        assert all(o in dtype for o in FLOAT32_OVERRIDES)
    assert code == (1 if status(dtype) == "FAIL" else 0)
    # 8 mini-batches per step: step metrics mix on- and off-policy updates, so the noise is not readable from them
    assert status(lines["on-policy noise"]) == "unknown" and "8 updates per step" in lines["on-policy noise"]
    # TEPO's lines apply to TEPO only; these runs predate the positive-share and penalty metrics
    for check in ("TEPO mask", "TEPO penalty strength", "mask rule"):
        assert status(lines[check]) == ("n/a" if not tepo else "unknown" if check != "mask rule" else "ok")
    if tepo:
        rule = next(k.rsplit("/", 1)[1] for k in committed(name)[1] if k.startswith("actor/tepo/mask_rule/"))
        assert f"ran {rule} on every step, no fallback" in lines["mask rule"]
    steps = [d for d in committed(name) if "response_length/clip_ratio" in d]
    tail = [d["response_length/clip_ratio"] for d in steps[-(len(steps) // 4):]]
    assert f"{statistics.fmean(tail):.3g} of responses end at the length cap" in lines["response length"]
    clip = statistics.fmean(d["actor/pg_clipfrac"] for d in steps)
    assert f"mean {clip:.3g} of tokens clipped" in lines["clipped share"]
    assert status(lines["learning signal"]) == "ok" and status(lines["entropy"]) == "ok"


def test_a_console_with_the_adapters_warning_gives_the_measured_dtype(tmp_path, capsys):
    shutil.copyfile(metrics_file(RUNS / "tepo-seed1"), tmp_path / "metrics.jsonl.gz")  # as committed
    warning = precision_warning(torch.bfloat16, 3e-4, 4e-4, "tepo")
    (tmp_path / "console.log").write_text(f"(WorkerDict pid=123) {warning}\n")
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(compose_config(["+algorithm=tepo"])))  # says cuda
    code, lines = run_doctor(capsys, tmp_path)
    assert "bfloat16, read by the adapter in the run" in lines["log-prob dtype"]
    assert status(lines["log-prob dtype"]) == "FAIL" and code == 1


# ---- synthetic GPU-like runs with a real composed config ------------------------------------------------------------

def gpu_config(tmp_path: Path, *overrides: str) -> Path:
    """verl's real composed config for a one-update-per-step TEPO run on CUDA, where Hydra saves it."""
    config = compose_config(["+algorithm=tepo", "trainer.device=cuda", "data.train_batch_size=64",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=64", *overrides])
    path = tmp_path / "outputs" / "2026-12-01" / "10-00-00" / ".hydra" / "config.yaml"
    path.parent.mkdir(parents=True)
    OmegaConf.save(config, path)
    return path


def gpu_like_metrics(noise_std: float, steps: int = 12, seed: int = 0, **overrides) -> list[dict]:
    """Step records like a GPU's on-policy updates: each response's token log-ratios are float noise of
    `noise_std`, so the sequence ratio is exp(mean of 500 of them)."""
    rng = np.random.default_rng(seed)
    records = []
    for step in range(1, steps + 1):
        seq_log_ratio = rng.normal(0, noise_std, size=(256, 500)).mean(axis=1)  # (B,)
        data = {
            "actor/pg_clipfrac": float(np.mean(np.abs(seq_log_ratio) > 3e-4) / 2),
            "actor/ppo_kl": float(-seq_log_ratio.mean()),
            "actor/tepo/seq_ratio_max": float(np.exp(seq_log_ratio.max())),
            "actor/tepo/seq_ratio_min": float(np.exp(seq_log_ratio.min())),
            "actor/tepo/mask_frac": 0.2, "actor/tepo/mask_frac_positive": 0.4,
            "actor/tepo/penalty_grad_share": 0.3, "actor/tepo/mask_rule/surprisal_old": 1.0,
            "actor/tepo/mask_fallback_used": 0.0,
            "tepo_verl/entropy_token_mean": 0.6 - 0.01 * step,
            "response_length/clip_ratio": 0.01, "response_length/max": 3000.0,
            "critic/score/min": 0.0, "critic/score/max": 1.0,
            "critic/advantages/min": -1.5, "critic/advantages/max": 1.5,
        }
        data.update({k: (v(step) if callable(v) else v) for k, v in overrides.items()})
        records.append({"step": step, "data": data})
    return records


def write_run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.mark.parametrize("noise_std, expected", [(1e-6, "ok"), (1e-3, "warn"), (2e-2, "FAIL")])
def test_gpu_like_noise_against_the_clip_range(noise_std, expected, tmp_path, capsys):
    records = gpu_like_metrics(noise_std)
    run = write_run(tmp_path / "run", records)
    gpu_config(run)
    code, lines = run_doctor(capsys, run)
    worst = max(abs(math.log(r["data"][f"actor/tepo/seq_ratio_{side}"])) for r in records for side in ("min", "max"))
    line = lines["on-policy noise"]
    assert status(line) == expected, line
    assert f"= {worst:.2e}, {worst / 3e-4:.2g}x the clip range 0.0003/0.0004" in line
    kl = max(abs(r["data"]["actor/ppo_kl"]) for r in records)
    clipped = max(r["data"]["actor/pg_clipfrac"] for r in records)
    assert f"|ppo_kl| max {kl:.1e}, clipped share max {clipped:.3g}" in line
    # on CUDA the log-probs are float32 by verl's source, with bf16 autocast: the dtype resolves the clip range
    assert status(lines["log-prob dtype"]) == "ok" and "float32, from the config: cuda" in lines["log-prob dtype"]
    assert "one update per step" in lines["clipped share"]
    for check in ("TEPO mask", "TEPO penalty strength", "mask rule", "entropy", "learning signal", "response length"):
        assert status(lines[check]) == "ok", lines[check]
    assert code == (1 if expected == "FAIL" else 0)


def test_a_logged_noise_metric_is_read_first_from_the_table(tmp_path, capsys):
    name = doctor.METRICS["noise_token"][0]  # what the loss logs: the max over the step's updates
    run = write_run(tmp_path / "run", gpu_like_metrics(1e-6, **{name: lambda step: 1e-4 * step}))
    gpu_config(run)  # one update per step: the step's max is the on-policy update's
    _, lines = run_doctor(capsys, run)
    assert f"({name}), max over 12 steps = 1.20e-03, 4x the clip range" in lines["on-policy noise"]
    assert status(lines["on-policy noise"]) == "warn"  # a token statistic: the sequence ratio averages it down


def test_with_several_updates_a_step_only_an_on_policy_metric_is_noise(tmp_path, capsys):
    """With 4 updates a step the step's |log-ratio| max is the later updates' drift (12.4 on the chain's TEPO
    runs), not noise; a metric of the on-policy update alone still is."""
    mixed = doctor.METRICS["noise_token"][0]
    alone = next(n for n in doctor.METRICS["noise_token"] if doctor.ON_POLICY_ONLY in n)
    for logged, expected in (({mixed: 5.0}, "unknown"), ({mixed: 5.0, alone: 2e-3}, "warn")):
        run = write_run(tmp_path / expected, gpu_like_metrics(1e-6, **logged))
        gpu_config(run, "actor_rollout_ref.actor.ppo_mini_batch_size=16")
        _, lines = run_doctor(capsys, run)
        line = lines["on-policy noise"]
        assert status(line) == expected, line
        if expected == "unknown":
            assert "4 updates per step" in line and f"{mixed}: over all of a step's updates" in line
        else:
            assert f"({alone}), max over 12 steps = 2.00e-03" in line


def test_a_committed_study_record_gives_the_runs_precision(tmp_path, capsys):
    """A committed study run has its run.json, no Hydra config: the regime's PRECISION=float32 is the float32 actor
    (recipes/cpu.sh), so the dtype line is float32, not the CPU's bf16 autocast."""
    source = RUNS.parent / "cpu-chain" / "tepo-seed1"
    record = json.loads((source / "run.json").read_text())
    assert record["regime"]["PRECISION"] == "float32" and not any("param_dtype" in o for o in record["overrides"])
    for precision, dtype, expected in (("float32", "float32", "ok"), ("bf16", "bfloat16", "FAIL")):
        run = write_run(tmp_path / precision, [json.loads(line) for line in committed_lines(source)])
        (run / "run.json").write_text(json.dumps({**record, "regime": {**record["regime"], "PRECISION": precision},
                                                  "command": record["command"].replace("float32", precision)}))
        _, lines = run_doctor(capsys, run)
        assert status(lines["log-prob dtype"]) == expected and f"] log-prob dtype: {dtype}," in lines["log-prob dtype"]
    # the committed run itself (docs/doctor.md): float32, the drift of 8 updates a step not read as noise, a mask
    # over nearly every positive token (a note, as the default does), and the penalty's strength unknown: the run
    # logged the older penalty_grad_ratio, which the doctor does not read
    _, lines = run_doctor(capsys, source)
    assert status(lines["log-prob dtype"]) == "ok" and status(lines["on-policy noise"]) == "unknown"
    assert status(lines["TEPO mask"]) == "note" and "nearly every positive token by design" in lines["TEPO mask"]
    assert status(lines["TEPO penalty strength"]) == "unknown" and "penalty_grad_share not logged" in lines[
        "TEPO penalty strength"]
    # with the precision only in the command (no regime), the command's assignment is read
    (run / "run.json").write_text(json.dumps({**record, "regime": {}}))
    _, lines = run_doctor(capsys, run)
    assert "log-prob dtype: float32," in lines["log-prob dtype"]


@pytest.mark.parametrize("overrides, check, expected, fragment", [
    ({"critic/score/min": 0.0, "critic/score/max": 0.0}, "learning signal", "FAIL", "the reward is 0 on every"),
    ({"critic/advantages/min": 0.0, "critic/advantages/max": 0.0}, "learning signal", "warn", "12 of 12 steps"),
    ({"tepo_verl/entropy_token_mean": lambda s: 0.6 * 0.5 ** s}, "entropy", "FAIL", "collapsing"),
    ({"response_length/clip_ratio": 0.8}, "response length", "FAIL", "0.8 of responses end at the length cap (8192)"),
    ({"actor/tepo/mask_fallback_used": lambda s: float(s > 6), "actor/tepo/mask_rule/surprisal_old": 0.0,
      "actor/tepo/mask_rule/off": lambda s: float(s > 6)}, "mask rule", "FAIL", "fell back"),
    ({"actor/tepo/mask_frac_positive": 0.001}, "TEPO mask", "warn", "almost never acts"),
    ({"actor/tepo/penalty_grad_share": 0.8}, "TEPO penalty strength", "warn", "lower actor_rollout_ref.actor"),
])
def test_each_problem_gets_its_line_and_fix(overrides, check, expected, fragment, tmp_path, capsys):
    run = write_run(tmp_path / "run", gpu_like_metrics(1e-6, **overrides))
    gpu_config(run, "data.max_response_length=8192")
    code, lines = run_doctor(capsys, run)
    assert status(lines[check]) == expected and fragment in lines[check], lines[check]
    assert "-> fix: " in lines[check]
    assert code == (1 if expected == "FAIL" else 0)
    assert cli_main(["doctor", str(run), "--strict"]) == 1


@pytest.mark.parametrize("overrides, expected, fragment", [
    ((), "note", "median 0.005: weak, as it is at the default kl_coef 1; before raising it, read docs/algorithm.md#"),
    (("actor_rollout_ref.actor.policy_loss.tepo.kl_coef=10",), "note", "weak, as it is at the default kl_coef 1"),
    (("actor_rollout_ref.actor.policy_loss.tepo.kl_coef=0.1",), "warn", "the penalty barely moves the update -> "
     "fix: raise actor_rollout_ref.actor.policy_loss.tepo.kl_coef (now 0.1) toward the default 1"),
])
def test_a_weak_penalty_warns_only_below_the_default_kl_coef(overrides, expected, fragment, tmp_path, capsys):
    """At or above the default kl_coef a weak penalty is a note that links the docs (where the float32 study's dose
    arms are), with nothing to fix; below it, a warning whose fix goes back up."""
    run = write_run(tmp_path / "run", gpu_like_metrics(1e-6, **{"actor/tepo/penalty_grad_share": 0.005}))
    gpu_config(run, *overrides)
    code, lines = run_doctor(capsys, run)
    line = lines["TEPO penalty strength"]
    assert status(line) == expected and fragment in line, line
    assert ("-> fix:" in line) == (expected == "warn")
    assert cli_main(["doctor", str(run), "--strict"]) == (1 if expected == "warn" else 0)


@pytest.mark.parametrize("rule, expected, fragment", [
    ("surprisal_old", "note", "mask_rule=surprisal_old selects nearly every positive token by design"),
    ("always", "note", "mask_rule=always selects nearly every positive token by definition"),
    ("old", "warn", "nearly every positive token is penalised -> fix: check mask_rule (with mask_rule=old"),
])
def test_a_broad_mask_warns_only_for_a_rule_that_should_be_narrow(rule, expected, fragment, tmp_path, capsys):
    """The surprisal rules take nearly every positive-advantage token by their test, and the float32 controls found
    no narrower selection better (docs/algorithm.md); rule `old` taking them all points at noise."""
    records = gpu_like_metrics(1e-6, **{"actor/tepo/mask_frac_positive": 0.98})
    for record in records:  # the rule that ran is the configured one
        record["data"][f"actor/tepo/mask_rule/{rule}"] = record["data"].pop("actor/tepo/mask_rule/surprisal_old")
    run = write_run(tmp_path / "run", records)
    gpu_config(run, f"actor_rollout_ref.actor.policy_loss.tepo.mask_rule={rule}")
    _, lines = run_doctor(capsys, run)
    line = lines["TEPO mask"]
    assert status(line) == expected and fragment in line, line
    assert cli_main(["doctor", str(run), "--strict"]) == (1 if expected == "warn" else 0)


def test_a_tepo_nomask_run_gets_na_on_the_mask_and_penalty_lines(capsys):
    """With mask_rule=off (the tepo_nomask preset) there is no mask to judge: neither 'almost never acts' nor 'weak'."""
    code, lines = run_doctor(capsys, RUNS.parent / "cpu-chain" / "tepo_nomask-seed1")
    for check in ("TEPO mask", "TEPO penalty strength"):
        assert status(lines[check]) == "n/a" and "mask_rule=off" in lines[check], lines[check]
    assert status(lines["mask rule"]) == "ok" and code == 0


def test_a_gspo_run_gets_na_on_tepos_lines_and_a_cfg_job_dump_is_read(tmp_path, capsys):
    records = [{"step": r["step"], "data": {k: v for k, v in r["data"].items() if not k.startswith("actor/tepo/")}}
               for r in gpu_like_metrics(1e-6)]
    run = write_run(tmp_path / "run", records)
    dump = tmp_path / "job.txt"  # `python -m verl.trainer.main_ppo --cfg job ... > job.txt 2>&1`: warnings first
    config = compose_config(["+algorithm=gspo", "trainer.device=cuda"])
    dump.write_text("UserWarning: something from verl\n" + OmegaConf.to_yaml(config))
    code, lines = run_doctor(capsys, run, "--config", dump)
    assert all(status(lines[c]) == "n/a" for c in ("TEPO mask", "TEPO penalty strength", "mask rule"))
    assert status(lines["log-prob dtype"]) == "ok" and code == 0


def test_a_compressed_run_reads_as_its_plain_copy(tmp_path, capsys):
    """The same committed run, as its folder holds it (metrics.jsonl.gz) and decompressed (metrics.jsonl, as verl
    writes it), each beside its run.json: the same findings and exit code, given the folder or the file."""
    source = RUNS.parent / "cpu-chain" / "tepo-seed1"
    compressed, plain = tmp_path / "gz" / "tepo-seed1", tmp_path / "plain" / "tepo-seed1"
    for folder in (compressed, plain):
        folder.mkdir(parents=True)
        shutil.copyfile(source / "run.json", folder / "run.json")
    shutil.copyfile(metrics_file(source), compressed / "metrics.jsonl.gz")
    (plain / "metrics.jsonl").write_bytes(gzip.decompress(metrics_file(source).read_bytes()))
    results = [run_doctor(capsys, given) for given in (compressed, compressed / "metrics.jsonl.gz", plain,
                                                        plain / "metrics.jsonl")]
    assert len(results[0][1]) == len(doctor.CHECKS) and status(results[0][1]["mask rule"]) == "ok"
    assert all(result == results[0] for result in results[1:])


# ---- broken input ---------------------------------------------------------------------------------------------------

def test_a_half_written_last_line_is_skipped_with_a_note(tmp_path, capsys):
    lines = committed_lines(RUNS / "tepo-seed1")
    whole = write_run(tmp_path / "whole", [])
    (whole / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    cut = write_run(tmp_path / "cut", [])
    (cut / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    code_whole, findings_whole = run_doctor(capsys, whole)
    code_cut, findings_cut = run_doctor(capsys, cut)
    assert "half-written" in findings_cut.pop("metrics file")
    assert findings_cut == findings_whole and code_cut == code_whole


@pytest.mark.parametrize("setup, argv, fragment", [
    (None, ["{tmp}/nope"], "run {tmp}/nope does not exist"),
    ("empty", ["{tmp}/run"], "run folder {tmp}/run has no metrics.jsonl"),
    ("middle", ["{tmp}/run"], "metrics.jsonl:2: not a verl file-logger record"),
    ("ok", ["{tmp}/run", "--config", "{tmp}/missing.yaml"], "config file {tmp}/missing.yaml does not exist"),
    ("ok", ["{tmp}/run", "--config", "{tmp}/other.yaml"], "config {tmp}/other.yaml is not a composed verl config"),
    ("ok", ["{tmp}/run", "--config", "{tmp}/run/metrics.jsonl"], "metrics.jsonl is not YAML"),
    ("both", ["{tmp}/run"], "run folder {tmp}/run holds both metrics.jsonl and metrics.jsonl.gz: keep one"),
    ("not gzip", ["{tmp}/run"], "cannot read run file {tmp}/run/metrics.jsonl.gz: Not a gzipped file"),
    ("cut gzip", ["{tmp}/run"], "cannot read run file {tmp}/run/metrics.jsonl.gz: Compressed file ended"),
])
def test_bad_input_is_one_line(setup, argv, fragment, tmp_path, capsys):
    run = tmp_path / "run"
    if setup:
        run.mkdir()
    if setup == "middle":
        (run / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n{oops\n{"step": 2, "data": {}}\n')
    if setup in ("ok", "both"):
        write_run(run, gpu_like_metrics(1e-6, steps=2))
        (tmp_path / "other.yaml").write_text("model: qwen\n")
    if setup == "both":
        (run / "metrics.jsonl.gz").write_bytes(gzip.compress((run / "metrics.jsonl").read_bytes()))
    if setup == "not gzip":
        (run / "metrics.jsonl.gz").write_text('{"step": 1, "data": {}}\n')  # a plain file with the compressed name
    if setup == "cut gzip":  # a compressed copy cut short
        packed = gzip.compress("".join(json.dumps(r) + "\n" for r in gpu_like_metrics(1e-6, steps=20)).encode())
        (run / "metrics.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    code = cli_main(["doctor", *[a.replace("{tmp}", str(tmp_path)) for a in argv]])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert fragment.replace("{tmp}", str(tmp_path)) in err, err


# ---- the doctor reads what the plugin and verl log ------------------------------------------------------------------

def metrics_the_loss_logs() -> set[str]:
    """Every metric name the adapted loss logs for a TEPO step (both entropies given), as verl's trainer names it
    (`actor/` + the worker's key): one two-mini-batch step through verl's real ppo_loss, the engine's and the
    worker's collection and the driver's reduction (tests/test_token_weighted_metrics.py's helpers)."""
    from test_token_weighted_metrics import (
        rank_data,
        rank_metrics,
        step_values,
        tepo_config,
        the_batch,
        worker_reduction,
    )
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import append_to_dict

    config, batch = tepo_config(), the_batch()
    per_mini_batch = []
    for rows in (list(range(6)), list(range(6, 12))):
        data = rank_data(batch, rows, dp_size=1, tokens=int(batch.response_mask[rows].sum()), max_token_len=20)
        per_mini_batch.append(worker_reduction([rank_metrics(config, batch, rows, data, 2)[0]]))
    collected: dict = {}
    for output in per_mini_batch:
        append_to_dict(collected, output)
    assert step_values(per_mini_batch)  # the tepo/ part reduces
    return {key if key.startswith("actor/") else f"actor/{key}" for key in reduce_metrics(collected)}


def metrics_verl_logged() -> set[str]:
    """The names verl's real trainer logged on the committed float32 study runs (a TEPO run and a DAPO run, whose
    dynamic sampling logs the filter's metrics), the plugin's run metrics included."""
    names: set[str] = set()
    for arm in ("tepo-seed1", "dapo-seed1"):
        for line in committed_lines(RUNS.parent / "cpu-chain" / arm):
            names |= set(json.loads(line)["data"])
    return names


def test_the_doctor_reads_only_metrics_that_something_logs():
    """Every name the doctor reads is logged: an `actor/tepo/` name by the plugin's loss as it is now, any other by
    verl's trainer on a real run. (It once read actor/tepo/seq_log_ratio_abs_max and onpolicy_* names that nothing
    logged, so the on-policy noise check said "unknown" on every multi-update run.)"""
    loss, verl = metrics_the_loss_logs(), metrics_verl_logged()
    read = {name for names in doctor.METRICS.values() for name in names}
    assert {name for name in read if name.startswith("actor/tepo/") and name not in loss} == set()
    assert {name for name in read if not name.startswith("actor/tepo/") and name not in verl} == set()
    assert any(doctor.ON_POLICY_ONLY in name for name in read & loss)  # the multi-update noise check has its metric
    assert {name for name in loss if name.startswith(doctor.MASK_RULE_PREFIX)} == {
        f"{doctor.MASK_RULE_PREFIX}surprisal_old"}  # the mask-rule check's family, read by prefix
