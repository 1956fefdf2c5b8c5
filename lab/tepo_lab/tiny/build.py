"""Build (offline, seeded, cached) a tiny Qwen2 policy and the addition task for CPU runs of verl.

    python -m tepo_lab.tiny build --out DIR      # or without --out: ~/.cache/tepo-verl/tiny/<key>

DIR/model/      Qwen2ForCausalLM (safetensors, float32, head_dim 32 as vLLM's CPU attention needs) and the
                byte-level tokenizer with Qwen's special tokens and ChatML chat template
DIR/data/       train.parquet, val.parquet in verl's schema
DIR/manifest.json   paths (incl. the reward file), sizes, the warm-up accuracy, the build key

The policy is a short supervised warm-up (plain torch, answer tokens only) of a random model, stopped early so
that it is right sometimes but not always, like a base model: its sampled (T=1) accuracy is measured on the
validation problems and recorded in the manifest. Everything is seeded and runs single-threaded, so a build is
byte-for-byte reproducible on one machine; a finished build is reused when its key (all parameters + builder
version) matches. Across machines the warm-up differs in its last bits, so for the default spec the builder copies
the policy shipped in the package (lab/tepo_lab/tiny/policies/addition, see shipped.py) instead of training:
the same start everywhere. `--retrain` trains it here.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from tepo_lab.tiny import task
from tepo_lab.tiny import tokenizer as tiny_tokenizer
from tepo_lab.tiny.common import (
    PolicySpec,
    build_cached,
    build_key,
    build_manifest,
    default_cache_root,
    generate,
    new_policy,
    paths,  # noqa: F401  (importable from here, as before the move to common.py)
    responses_sha256,
    single_thread,
    supervised_batch,
    supervised_warm_up,
    write_data,
)
from tepo_lab.tiny.common import model_config as _model_config

BUILDER_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TinySpec(PolicySpec):
    # the model and the warm-up's batch and learning rate: PolicySpec (149,568 parameters, head_dim 32)
    # data: a + b with a, b drawn from these inclusive ranges
    a_range: tuple[int, int] = (10, 49)
    b_range: tuple[int, int] = (10, 49)
    train_size: int = 1024
    val_size: int = 128
    # warm-up: with the default operands 10..49, 800 steps gives 27% sampled (T=1) accuracy on the validation
    # problems (measured at build time and recorded in the manifest). The accuracy climbs steeply with the
    # step count, so the step count sets where on that curve the RL runs start.
    warmup_steps: int = 800

    def key(self) -> str:
        return build_key(self, builder=BUILDER_VERSION)

    def ranges(self) -> dict:
        """The operand ranges, as keyword arguments of task.problems and task.all_problems."""
        return {"a_range": tuple(self.a_range), "b_range": tuple(self.b_range)}


def split(spec: TinySpec) -> tuple[list[tuple], list[tuple]]:
    """(train, val) problems of the RL data, disjoint, seeded by spec.seed."""
    val = task.problems(spec.val_size, seed=spec.seed * 1000 + 2, **spec.ranges())
    train = task.problems(spec.train_size, seed=spec.seed * 1000 + 1, exclude=set(val), **spec.ranges())
    return train, val


def sample_accuracy(model, tok, pairs, seed: int, temperature: float = 1.0, max_new_tokens: int = 6) -> float:
    """Share of problems whose sampled (temperature>0) or greedy (0) answer gets reward 1."""
    from tepo_lab.tiny.reward import compute_score

    responses, _ = generate(model, tok, [task.question(a, b) for a, b in pairs], temperature, seed, max_new_tokens)
    scores = [compute_score(task.DATA_SOURCE, tok.decode(r), str(a + b)) for r, (a, b) in zip(responses, pairs)]
    return sum(scores) / len(scores)


def shipped_measurements(model_dir: Path, spec: TinySpec) -> dict:
    """The measured fields of a shipped policy's manifest (lab/tepo_lab/tiny/shipped.py) for the policy in model_dir:
    greedy and sampled (T=1) validation accuracy, the greedy top-two logit gap and responses, single-threaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with single_thread():
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        val = split(spec)[1]
        responses, gap = generate(model, tok, [task.question(a, b) for a, b in val], 0.0, 0, max_new_tokens=6)
        return {"val_accuracy_greedy": sample_accuracy(model, tok, val, seed=spec.seed, temperature=0.0),
                "val_accuracy_sampled_t1": sample_accuracy(model, tok, val, seed=spec.seed, temperature=1.0),
                "greedy_min_top2_logit_gap": gap,
                "greedy_responses_sha256": responses_sha256([tok.decode(r) for r in responses]),
                "parameters": sum(p.numel() for p in model.parameters()), "val_size": spec.val_size}


def _warm_up(spec: TinySpec, tok, val_pairs, log):
    """The policy trained from its seeded random init on the answers of problems that are not validation problems,
    drawn with a torch generator seeded with spec.seed."""
    import torch

    model = new_policy(spec)
    val_set = set(val_pairs)
    warm_pairs = [pair for pair in task.all_problems(**spec.ranges()) if pair not in val_set]
    rng = torch.Generator().manual_seed(spec.seed)

    def next_batch():
        pick = torch.randint(len(warm_pairs), (spec.warmup_batch,), generator=rng).tolist()
        return supervised_batch(tok, [(task.question(a, b), str(a + b)) for a, b in (warm_pairs[i] for i in pick)])

    supervised_warm_up(model, spec, next_batch, log, "tiny")
    return model


def _build_into(spec: TinySpec, out: Path, log, source: str | None = None) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from tepo_lab.tiny import shipped

    started = time.time()
    with single_thread():
        model_dir = out / "model"
        tiny_tokenizer.save_tokenizer(model_dir)
        _model_config(spec).save_pretrained(model_dir)
        tok = AutoTokenizer.from_pretrained(model_dir)
        train_pairs, val_pairs = split(spec)
        write_data(out / "data", [task.row(a, b, "train", i) for i, (a, b) in enumerate(train_pairs)],
                   [task.row(a, b, "test", i) for i, (a, b) in enumerate(val_pairs)])
        if source is None:
            model = _warm_up(spec, tok, val_pairs, log)
            model.save_pretrained(model_dir, safe_serialization=True)
        else:  # the policy shipped for this key (lab/tepo_lab/tiny/shipped.py): the same start on every machine
            shipped.install("addition", model_dir)
            model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            log(f"[tiny] policy: the shipped one ({source})")
        sampled = sample_accuracy(model, tok, val_pairs, seed=spec.seed, temperature=1.0)
        greedy = sample_accuracy(model, tok, val_pairs, seed=spec.seed, temperature=0.0)
    return build_manifest(spec, BUILDER_VERSION, source or "trained", sum(p.numel() for p in model.parameters()),
                          started, val_accuracy_sampled_t1=sampled, val_accuracy_greedy=greedy)


def build(out: str | Path | None = None, spec: TinySpec | None = None, force: bool = False, log=print,
          retrain: bool = False) -> dict:
    """Build into `out` (default: the cache dir for spec's key) unless a build with the same key and policy
    source is there. The policy is the shipped one when one is shipped for spec's key, unless `retrain`.

    Returns the manifest with its `paths`. Writes into a temporary sibling and renames, so an interrupted
    build never looks finished.
    """
    from tepo_lab.tiny import shipped

    spec = spec or TinySpec()
    out = Path(out) if out is not None else default_cache_root() / spec.key()
    source = None if retrain else shipped.source_for("addition", spec.key())
    return build_cached(out, spec.key(), source or "trained", lambda folder: _build_into(spec, folder, log, source),
                        force)
