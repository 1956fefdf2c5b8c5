"""tepo_lab.tiny: a seeded, offline, cached builder of a tiny Qwen2 policy + the addition task."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch  # noqa: F401  (required: the builder trains with it; no skip, a missing one is a failure)

from tepo_lab.tiny import reward, task
from tepo_lab.tiny.build import TinySpec, build

#: Small enough to build in a few seconds.
SMALL = dataclasses.replace(TinySpec(), train_size=64, val_size=16, warmup_steps=12, warmup_batch=16)


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "a"
    return build(out, SMALL, log=lambda *_: None)


def test_deterministic(small_build, tmp_path):
    again = build(tmp_path / "b", SMALL, log=lambda *_: None)
    a, b = Path(small_build["paths"]["model"]).parent, Path(again["paths"]["model"]).parent
    assert _hashes(a) == _hashes(b)
    assert small_build["val_accuracy_sampled_t1"] == again["val_accuracy_sampled_t1"]


def test_cached(small_build):
    out = Path(small_build["paths"]["model"]).parent
    stamp = (out / "model" / "model.safetensors").stat().st_mtime_ns
    again = build(out, SMALL, log=lambda *_: None)
    assert again["cached"] is True and again["key"] == small_build["key"]
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    other = dataclasses.replace(SMALL, seed=1)
    assert other.key() != SMALL.key()


def test_parquet_in_verl_schema(small_build):
    import pandas as pd

    train = pd.read_parquet(small_build["paths"]["train"])
    val = pd.read_parquet(small_build["paths"]["val"])
    assert len(train) == SMALL.train_size and len(val) == SMALL.val_size
    for frame in (train, val):
        assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(frame.columns)
        for _, row in frame.iterrows():
            (message,) = list(row["prompt"])
            assert message["role"] == "user"
            a, b = row["extra_info"]["a"], row["extra_info"]["b"]
            assert message["content"] == f"What is {a}+{b}?"
            assert row["reward_model"]["ground_truth"] == str(a + b)
            assert row["data_source"] == task.DATA_SOURCE
    pairs = lambda f: {(r["a"], r["b"]) for r in f["extra_info"]}  # noqa: E731
    assert not pairs(train) & pairs(val)


def test_model_and_tokenizer_load(small_build):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = small_build["paths"]["model"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    config = model.config
    assert config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM's CPU attention
    assert len(tok) <= config.vocab_size
    text = "What is 37+85?\n ok"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("\n")) == 1
    assert len(tok.encode("122")) == 3  # multi-token answers
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 1+2?"}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt == "<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = torch.tensor([tok.encode(prompt)])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size) and torch.isfinite(logits).all()


def test_manifest(small_build):
    out = Path(small_build["paths"]["model"]).parent
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["key"] == SMALL.key()
    assert 0.0 <= manifest["val_accuracy_sampled_t1"] <= 1.0
    assert Path(small_build["paths"]["reward"]).samefile(reward.__file__)


def test_cli(tmp_path, capsys):
    from tepo_lab.tiny.__main__ import main

    argv = ["build", "--out", str(tmp_path / "c"), "--warmup-steps", "2", "--train-size", "8", "--val-size", "4"]
    assert main(argv + ["--print", "model"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c" / "model")
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is True


@pytest.mark.parametrize(
    "response, score",
    [("122", 1.0), ("122<|im_end|>", 1.0), (" the answer is 122", 1.0), ("121", 0.0), ("1221", 0.0),
     ("12 then 122", 1.0), ("122 then 12", 0.0), ("", 0.0), ("abc", 0.0)],
)
def test_reward(response, score):
    assert reward.compute_score(task.DATA_SOURCE, response, "122") == score


def test_default_model_size_and_answer_length():
    """What the docs state of the default build: a model of about 150k parameters, and answers of 2 digits (2
    tokens of the byte-level tokenizer) on every problem of the builder's operand ranges."""
    from transformers import Qwen2ForCausalLM

    from tepo_lab.tiny.build import _model_config

    spec = TinySpec()
    model = Qwen2ForCausalLM(_model_config(spec))
    assert round(sum(p.numel() for p in model.parameters()), -4) == 150_000
    assert {len(str(a + b)) for a, b in task.all_problems(spec.a_range, spec.b_range)} == {2}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--print", "weights"], "unknown --print field 'weights'; valid: model, train, val, reward, reward_name, dir"),
        (["--warmup-steps", "-1"], "--warmup-steps must be >= 0, got -1"),
        (["--val-size", "0"], "--train-size and --val-size must be >= 1, got 1024 and 0"),
        (["--train-size", "1500"], "--train-size + --val-size = 1628 exceeds the 1600 distinct problems"),
    ],
)
def test_cli_bad_input_is_one_line_before_any_build(argv, message, tmp_path, capsys):
    from tepo_lab.tiny.__main__ import main

    out = tmp_path / "never-built"
    assert main(["build", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_cli_out_is_a_file(tmp_path, capsys):
    from tepo_lab.tiny.__main__ import main

    (tmp_path / "f").write_text("x")
    assert main(["build", "--out", str(tmp_path / "f")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
