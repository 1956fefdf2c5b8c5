"""tepo_verl.evaluation: pass@k against brute force, maj@n tie rule, and an exact table from a synthetic
verl validation dump."""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tepo_verl.data.schema import make_row, write_parquet
from tepo_verl.evaluation import main, majority_vote, pass_at_k
from tepo_verl.evaluation.report import default_ks

# ---- pass@k ----------------------------------------------------------------------------------------------------


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> Fraction:
    """The share of all k-subsets of the samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(outcomes, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 10))
def test_pass_at_k_matches_enumeration_of_all_k_subsets(data, n):
    outcomes = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    k = data.draw(st.integers(1, n))
    expected = brute_force_pass_at_k(outcomes, k)
    assert pass_at_k(n, sum(outcomes), k) == pytest.approx(float(expected), abs=1e-12)


def test_pass_at_k_edge_cases_and_stability():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0 and pass_at_k(5, 3, 3) == 1.0
    # large n, where C(n, k) overflows a float: the product form still equals the exact binomial ratio
    for n, c, k in [(2048, 3, 64), (4096, 100, 1000), (1500, 0, 700), (1500, 1499, 1)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)
    for bad in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError, match="n=3"):
            pass_at_k(*bad)


def test_default_ks():
    assert default_ks(1) == [1] and default_ks(4) == [1, 2, 4] and default_ks(6) == [1, 2, 4, 6]


# ---- maj@n -------------------------------------------------------------------------------------------------------


def brute_force_majority(preds: list[str], correct: list[float]) -> Fraction:
    """Expected correctness when a random most-voted answer is chosen (answers compared without spaces)."""
    keys = ["".join(p.split()) for p in preds]
    counts = {k: keys.count(k) for k in set(keys) if k}
    if not counts:
        return Fraction(0)
    top = max(counts.values())
    tied = sorted(k for k, c in counts.items() if c == top)
    answer_grade = {k: Fraction(sum(c for kk, c in zip(keys, correct) if kk == k)) / counts[k] for k in tied}
    return sum(answer_grade.values(), Fraction(0)) / len(tied)


_answers = st.sampled_from(["", "1", "2", " 2", "\\frac{1}{2}", "3"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_answers, min_size=1, max_size=9), st.randoms(use_true_random=False))
def test_majority_vote_matches_reference_and_ignores_order(preds, rng):
    gold = "2"
    correct = [1.0 if "".join(p.split()) == gold else 0.0 for p in preds]
    expected = brute_force_majority(preds, correct)
    assert majority_vote(preds, correct) == pytest.approx(float(expected))
    order = list(range(len(preds)))
    rng.shuffle(order)
    assert majority_vote([preds[i] for i in order], [correct[i] for i in order]) == pytest.approx(float(expected))


def test_majority_vote_cases():
    assert majority_vote(["6", "6", "5", "7"], [0, 0, 1, 0]) == 0.0
    assert majority_vote(["1", "1", "2", "2"], [0, 0, 1, 1]) == 0.5  # tie: expected value of a random pick
    assert majority_vote(["", "", "", "9"], [0, 0, 0, 1]) == 1.0  # no-answer samples do not vote
    assert majority_vote(["", ""], [0, 0]) == 0.0
    with pytest.raises(ValueError, match="2 predictions but 1"):
        majority_vote(["1", "2"], [1])


# ---- the whole command on a synthetic verl validation dump ----------------------------------------------------------

# benchmark -> problems: (question, gold, four responses). The correctness of each response is known by design.
SYNTHETIC = {
    "aime24": [
        ("What is 2+3?", "5", ["so \\boxed{5}", "\\boxed{6}", "\\boxed{6}", "\\boxed{7}"]),  # 1 of 4; maj "6" wrong
        ("Halve one.", "\\frac{1}{2}", ["\\boxed{\\frac12}", "\\boxed{0.5}", "\\boxed{3}", "\\boxed{4}"]),  # 2 of 4
    ],
    "math500": [("Pick 2.", "2", ["\\boxed{1}", "\\boxed{1}", "\\boxed{2}", "\\boxed{2}"])],  # 2 of 4; 1-1 tie
    "minerva": [("Say nine.", "9", ["I don't know.", "no idea", "hmm", "The answer is \\boxed{9}"])],  # 1 of 4
}
# Expected values, worked out by hand:
#   aime24 : avg (1/4 + 2/4)/2 = 3/8; pass@2 (1 - C(3,2)/C(4,2) + 1 - C(2,2)/C(4,2))/2 = (1/2 + 5/6)/2 = 2/3;
#            pass@4 1; maj (0 + 1)/2 = 1/2
#   math500: avg 1/2; pass@2 5/6; pass@4 1; maj 1/2 (tie between "1" and "2")
#   minerva: avg 1/4; pass@2 1/2; pass@4 1; maj 1 (only "9" is an answer)
EXPECTED = {
    "aime24": (2, 4, Fraction(3, 8), Fraction(2, 3), Fraction(1), Fraction(1, 2)),
    "math500": (1, 4, Fraction(1, 2), Fraction(5, 6), Fraction(1), Fraction(1, 2)),
    "minerva": (1, 4, Fraction(1, 4), Fraction(1, 2), Fraction(1), Fraction(1)),
}
EXPECTED["average"] = (4, 4) + tuple(sum((EXPECTED[b][i] for b in SYNTHETIC), Fraction(0)) / 3 for i in range(2, 6))


def _chat_input(question: str) -> str:
    """What verl writes as `input`: the decoded chat prompt, special tokens removed."""
    return f"system\nYou are a helpful assistant.\nuser\n{question}\nPlease reason step by step.\nassistant\n"


def _write_dump(folder: Path, step: int, saved_acc: float, shuffle_seed: int) -> Path:
    records = [
        {"input": _chat_input(q), "output": r, "gts": gold, "score": saved_acc, "step": step, "reward": saved_acc,
         "acc": saved_acc, "pred": "x"}
        for problems in SYNTHETIC.values() for q, gold, responses in problems for r in responses
    ]
    random.Random(shuffle_seed).shuffle(records)  # sample order must not matter
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{step}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def val_parquet(tmp_path) -> Path:
    rows = [
        make_row(data_source=b, prompt=[{"role": "user", "content": q}], ground_truth=gold, split="test", index=i,
                 question=q, dataset=b, template="plain")
        for b, problems in SYNTHETIC.items() for i, (q, gold, _) in enumerate(problems)
    ]
    return write_parquet(rows, tmp_path / "val.parquet")


def _read_csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as handle:
        return {row["benchmark"]: row for row in csv.DictReader(handle)}


def test_synthetic_dump_gives_the_exact_table(tmp_path, val_parquet, capsys):
    folder = tmp_path / "val_generations"
    _write_dump(folder, step=10, saved_acc=1.0, shuffle_seed=1)  # an older step, all saved as correct
    _write_dump(folder, step=20, saved_acc=0.0, shuffle_seed=2)  # the newest step: chosen by default
    out = tmp_path / "results"
    argv = [str(folder), "--datasets", str(val_parquet), "--out-dir", str(out), "--no-progress", "--threads", "4"]
    assert main(argv) == 0
    table = _read_csv(out / "results.csv")
    assert list(table) == ["aime24", "math500", "minerva", "average"]
    for benchmark, (problems, n, avg, pass2, pass4, maj) in EXPECTED.items():
        row = table[benchmark]
        assert (int(row["problems"]), int(row["n"])) == (problems, n), benchmark
        for column, value in [("avg@n", avg), ("pass@1", avg), ("pass@2", pass2), ("pass@4", pass4), ("maj@n", maj)]:
            assert row[column] == f"{float(value):.6f}", (benchmark, column)
    markdown = (out / "results.md").read_text()
    assert markdown.splitlines()[0] == "| benchmark | problems | n | avg@n | pass@1 | pass@2 | pass@4 | maj@n |"
    assert "| aime24 | 2 | 4 | 37.5 | 37.5 | 66.7 | 100.0 | 50.0 |" in markdown
    assert "| average | 4 | 4 | 37.5 | 37.5 | 66.7 | 100.0 | 66.7 |" in markdown
    assert "aime24" in capsys.readouterr().out

    # --use-saved trusts verl's saved acc instead (here deliberately wrong: all 1.0 at step 10)
    assert main(argv + ["--step", "10", "--use-saved"]) == 0
    table = _read_csv(out / "results.csv")
    assert {r["avg@n"] for r in table.values()} == {"1.000000"}  # every saved acc at step 10 is 1.0
    assert {r["maj@n"] for r in table.values()} == {"1.000000"}  # all saved preds are "x", graded correct


def test_plain_jsonl_with_data_source_and_chosen_ks(tmp_path):
    path = tmp_path / "gens.jsonl"
    records = [
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "q1"}], "response": r, "ground_truth": "18"}
        for r in ["\\boxed{18}", "18 dollars", "\\boxed{17}"]
    ] + [{"data_source": "gsm8k", "problem": "q2", "response": "\\boxed{3}", "reward_model": {"ground_truth": "3"}}] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    assert main([str(path), "--k", "1", "3", "--out-dir", str(out), "--no-progress", "--isolation", "inline"]) == 0
    row = _read_csv(out / "results.csv")["gsm8k"]
    # q1: 2 of 3 right ("18 dollars" reads as 18); q2: 3 of 3
    assert (row["problems"], row["n"], row["avg@n"], row["pass@1"], row["pass@3"], row["maj@n"]) == (
        "2", "3", f"{(2 / 3 + 1) / 2:.6f}", f"{(2 / 3 + 1) / 2:.6f}", "1.000000", "1.000000")


def test_pass_at_k_is_blank_where_a_benchmark_has_too_few_samples(tmp_path):
    path = tmp_path / "g.jsonl"
    records = [{"data_source": "a", "problem": "p", "response": "\\boxed{1}", "ground_truth": "1"}] * 4
    records += [{"data_source": "b", "problem": "p", "response": "\\boxed{1}", "ground_truth": "1"}] * 2
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    assert main([str(path), "--k", "1", "4", "--out-dir", str(out), "--no-progress"]) == 0
    table = _read_csv(out / "results.csv")
    assert (table["a"]["pass@4"], table["b"]["pass@4"], table["average"]["pass@4"]) == ("1.000000", "", "")
    assert "| b | 1 | 2 | 100.0 | 100.0 | - | 100.0 |" in (out / "results.md").read_text()


def test_errors_name_the_problem(tmp_path, capsys):
    folder = tmp_path / "dump"
    _write_dump(folder, step=5, saved_acc=0.0, shuffle_seed=0)
    assert main([str(folder), "--no-progress"]) == 2
    assert "no data_source and none could be inferred: pass --datasets" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing.jsonl")]) == 2
    assert f"generations file or folder not found: {tmp_path / 'nothing.jsonl'}" in capsys.readouterr().err
    assert main([str(folder), "--step", "7", "--data-source", "x"]) == 2
    assert "no 7.jsonl in" in capsys.readouterr().err
    both = tmp_path / "both.jsonl"
    both.write_text((folder / "5.jsonl").read_text() + json.dumps({"output": "1", "gts": "1", "step": 6}) + "\n")
    assert main([str(both), "--data-source", "x"]) == 2
    assert "several steps [5, 6]: choose one with --step" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"data_source": "a", "gts": "1"}) + "\n")
    assert main([str(bad)]) == 2
    assert "sample 1 has no response field; expected one of output, response" in capsys.readouterr().err
    assert main([str(folder), "--k", "0", "--data-source", "x"]) == 2
    assert "--k values must be >= 1" in capsys.readouterr().err


def test_end_to_end_on_the_shipped_sets_with_real_prompts(tmp_path):
    """Convert the offline sets, fake a verl dump whose `input` is the Qwen chat prompt decoded the way verl
    decodes it, and check the mapping back to benchmarks and the grading of every reference answer: two samples
    answer the boxed reference, one gives no answer, so each benchmark must read avg 2/3, pass@3 1, maj 1."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest_data
    import pyarrow.parquet as pq

    from tepo_verl.data import main as data_main

    source = conftest_data.math_eval_dir()
    tokenizer = conftest_data.qwen_tokenizer()
    data_dir = tmp_path / "data"
    assert data_main(["convert", "eval", "--local-dir", str(source), "--offline", "--out-dir", str(data_dir),
                      "--combine-eval", str(data_dir / "val.parquet"), "--no-progress"]) == 0
    rng = random.Random(7)
    records = []
    for name in ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"):
        rows = pq.read_table(data_dir / f"{name}.parquet").to_pylist()
        for row in rows if len(rows) <= 40 else rng.sample(rows, 40):
            ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            prompt = tokenizer.decode(tokenizer(ids)["input_ids"], skip_special_tokens=True)
            gold = row["reward_model"]["ground_truth"]
            for response in [f"The answer is \\boxed{{{gold}}}.", f"So \\boxed{{{gold}}}", "I give up."]:
                records.append({"input": prompt, "output": response, "gts": gold, "score": 0.0, "step": 3})
    dump = tmp_path / "3.jsonl"
    dump.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    # a generous time bound: this checks the mapping and the grading, not the default's (which a loaded CI can miss)
    assert main([str(dump), "--datasets", str(data_dir / "val.parquet"), "--out-dir", str(out), "--no-progress",
                 "--timeout", "120"]) == 0
    table = _read_csv(out / "results.csv")
    assert list(table) == ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench", "average"]
    for benchmark, row in table.items():
        assert (row["n"], row["avg@n"], row["pass@1"], row["pass@2"], row["pass@3"], row["maj@n"]) == (
            "3", "0.666667", "0.666667", "1.000000", "1.000000", "1.000000"), benchmark
    assert table["aime24"]["problems"] == "30" and table["math500"]["problems"] == "40"
