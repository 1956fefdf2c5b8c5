"""The tiny policies shipped in the package (lab/tepo_lab/tiny/policies) and the scratchpad task.

Every machine starts from the same policy: the shipped files match their manifest, the builders use them for the
default spec, and decoding the validation problems greedily from the shipped weights reproduces the accuracy the
manifest records, exactly.

Why exact equality is a fair test across machines: the accuracy is a count of problems, which changes only if a
greedy choice changes. Another CPU may round the float32 logits differently in their last bits (about 1e-6 of
logits of order 10), which can flip a choice only where the top two logits are that close. The manifest records
the smallest top-two gap over every greedy choice, and the test recomputes it and requires it to be far above
that rounding (1e-4), so a flipped choice, and a different accuracy, would be a real change, not noise. The gap
itself is a float, so another CPU measures it only to that rounding (2e-6 to 7e-6 apart on two Xeons): it is compared
within ROUNDING, every count and digest exactly.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import recipe_standin
import torch

from tepo_lab.tiny import regenerate, reward, scratchpad, shipped
from tepo_lab.tiny import task as addition
from tepo_lab.tiny.build import TinySpec
from tepo_lab.tiny.build import build as build_addition

REPO = Path(__file__).resolve().parents[1]
#: Far above float32 rounding of the logits (about 1e-6 of values of order 10), far below the recorded gaps.
GAP_FLOOR = 1e-4
#: How far two CPUs' float32 measurements of one top-two logit gap may differ (their logits' last bits).
ROUNDING = 1e-5


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def default_build(tmp_path_factory):
    """The default build of a task (its builder installs the shipped policy and measures it), made once per module:
    the build's own test and the regeneration from it read the same folder."""
    built: dict[str, tuple[Path, dict]] = {}

    def get(task: str) -> tuple[Path, dict]:
        if task not in built:
            folder, builder = tmp_path_factory.mktemp(f"{task}-build") / "build", regenerate.TASKS[task]
            built[task] = folder, builder.build(folder, builder.spec(), log=lambda *_: None)
        return built[task]

    return get


def _load(task: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = shipped.folder(task)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


# ------------------------------------------------------------------------------------------- the shipped files

def test_every_task_ships_a_policy():
    assert shipped.tasks() == sorted(regenerate.TASKS) == ["addition", "chain", "scratchpad"]


@pytest.mark.parametrize("task", sorted(regenerate.TASKS))
def test_shipped_files_match_the_manifest(task):
    manifest = shipped.manifest(task)
    assert manifest is not None, f"no policy shipped for {task}"
    spec = regenerate.TASKS[task].spec()
    assert manifest["task"] == task and manifest["key"] == spec.key()
    assert manifest["spec"] == json.loads(json.dumps(dataclasses.asdict(spec)))
    assert set(manifest["files"]) == set(shipped.FILES)
    for name, digest in manifest["files"].items():
        path = shipped.folder(task) / name
        assert shipped.sha256(path) == digest, name
        assert path.stat().st_size < 5 * 2**20, name
    assert shipped.source_for(task, manifest["key"]) == "shipped:" + manifest["files"][shipped.WEIGHTS][:12]
    assert shipped.source_for(task, "another-key") is None


def test_setup_ships_the_policies_as_package_data(monkeypatch):
    """The lab's setup.py package_data globs cover every shipped file (else a pip install would start elsewhere)."""
    import fnmatch

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(REPO / "lab")
    setup_py = REPO / "lab" / "setup.py"
    exec(compile(setup_py.read_text(), str(setup_py), "exec"), {"__name__": "setup", "__file__": str(setup_py)})
    patterns = captured["package_data"]["tepo_lab"]
    package = REPO / "lab" / "tepo_lab"
    for task in shipped.tasks():
        for path in shipped.folder(task).iterdir():
            relative = str(path.relative_to(package))
            assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


# ------------------------------------------------------------------------------ reproduce the recorded accuracy

def test_addition_policy_reproduces_its_greedy_accuracy(one_thread):
    from tepo_lab.tiny.build import sample_accuracy

    manifest = shipped.manifest("addition")
    model, tok = _load("addition")
    spec = TinySpec()
    val = addition.problems(spec.val_size, seed=spec.seed * 1000 + 2, a_range=spec.a_range, b_range=spec.b_range)
    responses, gap = scratchpad.generate(model, tok, [addition.question(a, b) for a, b in val], max_new_tokens=6)
    assert gap > GAP_FLOOR and manifest["greedy_min_top2_logit_gap"] > GAP_FLOOR
    assert sample_accuracy(model, tok, val, seed=spec.seed, temperature=0.0) == manifest["val_accuracy_greedy"]
    assert scratchpad.responses_sha256([tok.decode(r) for r in responses]) == manifest["greedy_responses_sha256"]
    # the RL runs start neither hopeless nor solved
    assert 0.1 <= manifest["val_accuracy_sampled_t1"] <= 0.5


def test_the_scratchpad_and_chain_studies_start_neither_hopeless_nor_solved():
    """What the studies need of the recorded starts (the regeneration test below reproduces every recorded number
    from the shipped weights): responses of >= 24 tokens when sampled; the scratchpad right 20-40% of the time when
    sampled; the chain 10-40% greedy on >= 256 validation problems, and worse when sampled."""
    for task in ("scratchpad", "chain"):
        assert shipped.manifest(task)["val_mean_response_tokens_sampled_t1"] >= 24, task
    assert 0.2 <= shipped.manifest("scratchpad")["val_accuracy_sampled_t1"] <= 0.4
    chain = shipped.manifest("chain")
    assert 0.1 <= chain["val_accuracy_greedy"] <= 0.4 and chain["val_size"] == len(scratchpad.split(
        scratchpad.ChainSpec())[1]) >= 256
    assert chain["val_accuracy_sampled_t1"] < chain["val_accuracy_greedy"]


# ------------------------------------------------------------------------------- the builders use the shipped

def test_default_addition_build_installs_the_shipped_policy(tmp_path):
    manifest = build_addition(tmp_path / "a", log=lambda *_: None)
    recorded = shipped.manifest("addition")
    assert manifest["policy"] == shipped.source_for("addition", TinySpec().key())
    model = Path(manifest["paths"]["model"])
    assert shipped.sha256(model / shipped.WEIGHTS) == recorded["files"][shipped.WEIGHTS]
    assert manifest["val_accuracy_greedy"] == recorded["val_accuracy_greedy"]
    assert manifest["val_accuracy_sampled_t1"] == recorded["val_accuracy_sampled_t1"]
    # a build of the same key that trained its own policy (an older cache, or --retrain) is not reused
    stale = json.loads((tmp_path / "a" / "manifest.json").read_text())
    stale.pop("policy")
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(stale))
    assert build_addition(tmp_path / "a", log=lambda *_: None)["cached"] is False
    assert build_addition(tmp_path / "a", log=lambda *_: None)["cached"] is True


def test_a_non_default_spec_is_trained_not_shipped():
    small = dataclasses.replace(TinySpec(), warmup_steps=12)
    assert shipped.source_for("addition", small.key()) is None
    assert shipped.source_for("scratchpad", dataclasses.replace(scratchpad.ScratchSpec(), seed=1).key()) is None


@pytest.mark.parametrize("task", sorted(regenerate.TASKS))
def test_regenerating_from_the_shipped_policy_writes_the_same_manifest(task, tmp_path, monkeypatch, default_build):
    """regenerate --from a build of the shipped policy measures it with the task's builder and ships it again: the
    manifest comes out as recorded, every measured field (greedy decoding from the shipped weights reproduces the
    recorded accuracy, responses and lengths exactly) and every file's sha256."""
    recorded = shipped.manifest(task)
    built, _ = default_build(task)
    monkeypatch.setattr(shipped, "POLICIES", tmp_path / "policies")
    written = json.loads(json.dumps(regenerate.regenerate(task, built, log=lambda *_: None)))
    gap = "greedy_min_top2_logit_gap"
    assert written[gap] > GAP_FLOOR and recorded[gap] > GAP_FLOOR
    assert written[gap] == pytest.approx(recorded[gap], abs=ROUNDING)
    assert {**written, gap: recorded[gap]} == recorded
    assert shipped.manifest(task) == written and shipped.tasks() == [task]
    with pytest.raises(ValueError, match="not the default spec's"):
        other = tmp_path / "other"
        other.mkdir()
        (other / "manifest.json").write_text(json.dumps({"key": "another-key"}))
        regenerate.regenerate(task, other, log=lambda *_: None)


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="unknown task 'subtraction'; valid: addition, scratchpad, chain"):
        regenerate.regenerate("subtraction")
    shipped_tasks = "addition, chain, scratchpad"
    with pytest.raises(ValueError, match=f"no policy is shipped for task 'subtraction'; shipped: {shipped_tasks}"):
        shipped.folder("subtraction")
    assert shipped.source_for("subtraction", "any-key") is None  # a new task's builder trains until one is shipped


def test_installing_a_corrupted_policy_fails(tmp_path, monkeypatch):
    fake = tmp_path / "policies"
    (fake / "addition").mkdir(parents=True)
    for name in shipped.FILES:
        (fake / "addition" / name).write_bytes((shipped.folder("addition") / name).read_bytes())
    (fake / "addition" / "manifest.json").write_text((shipped.folder("addition") / "manifest.json").read_text())
    (fake / "addition" / shipped.WEIGHTS).write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    monkeypatch.setattr(shipped, "POLICIES", fake)
    with pytest.raises(RuntimeError, match="does not match its manifest"):
        shipped.install("addition", tmp_path / "model")


def test_default_scratchpad_build(default_build):
    import pandas as pd

    folder, manifest = default_build("scratchpad")
    recorded = shipped.manifest("scratchpad")
    assert manifest["policy"] == shipped.source_for("scratchpad", scratchpad.ScratchSpec().key())
    assert shipped.sha256(Path(manifest["paths"]["model"]) / shipped.WEIGHTS) == recorded["files"][shipped.WEIGHTS]
    assert manifest["val_accuracy_greedy"] == recorded["val_accuracy_greedy"]
    assert Path(manifest["paths"]["reward"]).samefile(reward.__file__)
    spec = scratchpad.ScratchSpec()
    train, val = pd.read_parquet(manifest["paths"]["train"]), pd.read_parquet(manifest["paths"]["val"])
    assert len(train) == spec.train_size and len(val) == spec.val_size
    for frame in (train, val):
        for _, row in frame.iterrows():
            ops = tuple(row["extra_info"]["operands"])
            (message,) = list(row["prompt"])
            assert message == {"role": "user", "content": "What is " + "+".join(map(str, ops)) + "?"}
            assert row["reward_model"]["ground_truth"] == str(sum(ops)) and row["data_source"] == scratchpad.DATA_SOURCE
    operands = lambda f: {tuple(r["operands"]) for r in f["extra_info"]}  # noqa: E731
    assert not operands(train) & operands(val)
    assert scratchpad.build(folder, log=lambda *_: None)["cached"] is True


def test_cli_builds_the_scratchpad_task(tmp_path, capsys):
    from tepo_lab.tiny.__main__ import main

    out = tmp_path / "cli"
    assert main(["build", "--task", "scratchpad", "--out", str(out), "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["key"] == scratchpad.ScratchSpec().key() and dry["built"] is False
    assert main(["build", "--task", "scratchpad", "--out", str(out), "--print", "dir"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "manifest.json").read_text())["policy"].startswith("shipped:")


# ----------------------------------------------------------------------------------------- the scratchpad task

def test_scratchpad_solution_and_sparse_reward():
    ops = (23, 45, 17, 38)
    text = scratchpad.solution(ops)
    assert scratchpad.question(ops) == "What is 23+45+17+38?"
    assert text == "23+45=68\n68+17=85\n85+38=123" and scratchpad.answer(ops) == "123"
    score = lambda response: reward.compute_score(scratchpad.DATA_SOURCE, response, "123")  # noqa: E731
    assert score(text) == 1.0 and score(text + "<|im_end|>") == 1.0
    assert score("23+45=60\n60+17=77\n77+38=123") == 1.0  # only the final answer counts
    assert score("23+45=68\n68+17=85\n85+38=122") == 0.0  # every partial sum right, the answer wrong
    assert score("23+45=68\n68+17=85\n85+38=12") == 0.0  # cut off by the length limit
    assert score("23+45=68\n68+17=85\n85+38=123\n123+1=124") == 0.0  # went on past the answer


def test_scratchpad_styles_end_on_the_answer():
    ops = (23, 45, 17, 38)
    rewrite, running_rest = scratchpad.solution(ops, "rewrite"), scratchpad.solution(ops, "running_rest")
    assert rewrite == "68+17+38\n85+38\n123"  # each line: the first two operands of the one before added
    assert running_rest == "23+45=68+17+38\n68+17=85+38\n85+38=123"  # the two operands, their sum, the rest
    for text in (rewrite, running_rest):
        assert reward.compute_score(scratchpad.DATA_SOURCE, text, scratchpad.answer(ops)) == 1.0
    assert scratchpad.solution((10, 11, 12), "rewrite") == "21+12\n33"
    assert scratchpad.solution((10, 11, 12), "running_rest") == "10+11=21+12\n21+12=33"
    assert scratchpad.solution(ops, "running") == "23+45=68\n68+17=85\n85+38=123"  # named, the default
    with pytest.raises(ValueError, match="style must be one of running, rewrite, running_rest, got 'tree'"):
        scratchpad.solution(ops, "tree")
    with pytest.raises(ValueError, match="scratchpad must be one of running, rewrite, running_rest, got 'tree'"):
        scratchpad.ChainSpec(scratchpad="tree")
    # the option is the chain task's (the scratchpad task's spec has no such field), and each style is a build of
    # its own; the shipped chain policy writes running_rest
    assert "scratchpad" not in dataclasses.asdict(scratchpad.ScratchSpec())
    keys = {style: scratchpad.ChainSpec(scratchpad=style).key() for style in scratchpad.SCRATCHPAD_STYLES}
    assert len(set(keys.values())) == 3 and keys["running_rest"] == shipped.manifest("chain")["key"]


def _recipe_lengths(tmp_path: Path, task: str) -> tuple[int, int]:
    """(data.max_prompt_length, data.max_response_length) that recipes/cpu.sh gives verl for TASK=task (its dry
    run, with verl and the tiny build stood in: tests/recipe_standin.py)."""
    proc, verl_args = recipe_standin.run_cpu_recipe(tmp_path, DRY_RUN="1", TASK=task)
    assert proc.returncode == 0 and verl_args is not None, proc.stderr[-3000:]
    given = dict(arg.split("=", 1) for arg in verl_args if arg.startswith("data.max_"))
    return int(given["data.max_prompt_length"]), int(given["data.max_response_length"])


def test_scratchpad_responses_are_long_and_fit_the_recipe(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shipped.folder("scratchpad"))
    spec = scratchpad.ScratchSpec()
    train, val = scratchpad.split(spec)
    lengths = [len(tok.encode(scratchpad.solution(ops))) + 1 for ops in train + val]  # + the end of turn
    assert min(lengths) >= 27 and max(lengths) <= 30 and sum(lengths) / len(lengths) >= 24
    assert max(lengths) < scratchpad.MAX_RESPONSE_TOKENS
    prompt_budget, response_budget = _recipe_lengths(tmp_path, "scratchpad")
    assert response_budget == scratchpad.MAX_RESPONSE_TOKENS  # the budget the shipped policy was measured with
    prompts = [len(scratchpad.encode_prompt(tok, scratchpad.question(ops))) for ops in train + val]
    assert max(prompts) <= prompt_budget


def test_scratchpad_problems_are_seeded_and_distinct():
    a = scratchpad.problems(300, seed=5)
    assert a == scratchpad.problems(300, seed=5) and a != scratchpad.problems(300, seed=6)
    assert len(set(a)) == 300 and all(len(ops) == 4 and all(10 <= x <= 49 for x in ops) for ops in a)
    assert not set(scratchpad.problems(100, seed=7, exclude=set(a))) & set(a)
    with pytest.raises(ValueError, match="only 16 distinct problems"):
        scratchpad.problems(17, seed=0, operands=2, operand_range=(1, 4))


# ---------------------------------------------------------------------------------------------- the chain task

def test_chain_problems_have_three_to_five_operands_seeded_and_distinct():
    from collections import Counter

    spec = scratchpad.ChainSpec()
    train, val = scratchpad.split(spec)
    assert len(train) == spec.train_size and len(val) == spec.val_size == 256 and not set(train) & set(val)
    counts = Counter(len(ops) for ops in train + val)
    assert set(counts) == {3, 4, 5} and min(counts.values()) > 0.3 * len(train + val)  # about a third each
    assert all(10 <= x <= 49 for ops in train + val for x in ops)
    assert scratchpad.problems(50, seed=5, operands=(3, 6)) == scratchpad.problems(50, seed=5, operands=(3, 6))
    assert spec.distinct_problems() == sum(40 ** k for k in range(3, 6))
    # the fixed-count path draws exactly as before (the scratchpad's data did not move)
    assert scratchpad.problems(3, seed=1) == scratchpad.problems(3, seed=1, operands=4)
    with pytest.raises(ValueError, match="only 20 distinct problems"):
        scratchpad.problems(21, seed=0, operands=(1, 2), operand_range=(1, 4))


def test_chain_responses_vary_in_length_and_fit_the_recipe(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shipped.folder("chain"))
    spec = scratchpad.ChainSpec()
    train, val = scratchpad.split(spec)
    assert spec.style() == "running_rest"
    lengths = [len(tok.encode(scratchpad.solution(ops, spec.style()))) + 1 for ops in train + val]  # + end of turn
    # the longest at least twice the shortest (token-level aggregation acts on different lengths), mean >= 24
    assert max(lengths) >= 2 * min(lengths) and sum(lengths) / len(lengths) >= 24 and min(lengths) >= 21
    assert max(lengths) < spec.MAX_RESPONSE_TOKENS
    prompt_budget, response_budget = _recipe_lengths(tmp_path, "chain")
    assert response_budget == spec.MAX_RESPONSE_TOKENS  # the budget the shipped policy was measured with
    prompts = [len(scratchpad.encode_prompt(tok, scratchpad.question(ops))) for ops in train + val]
    assert max(prompts) <= prompt_budget


def test_default_chain_build_installs_the_shipped_policy_and_the_chain_data(default_build):
    import pandas as pd

    _, manifest = default_build("chain")
    recorded = shipped.manifest("chain")
    assert manifest["task"] == "chain" and manifest["policy"] == shipped.source_for("chain", recorded["key"])
    assert shipped.sha256(Path(manifest["paths"]["model"]) / shipped.WEIGHTS) == recorded["files"][shipped.WEIGHTS]
    assert manifest["val_accuracy_greedy"] == recorded["val_accuracy_greedy"]
    val = pd.read_parquet(manifest["paths"]["val"])
    assert len(val) == 256 and set(val["data_source"]) == {"tepo_tiny_chain"}
    assert recorded["spec"]["init_policy"] == "scratchpad"  # warmed up from the shipped scratchpad policy
