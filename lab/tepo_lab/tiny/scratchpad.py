"""The scratchpad task: multi-operand addition where the model writes its partial sums before the answer.

    What is 23+45+17+38?  ->  23+45=68
                              68+17=85
                              85+38=123

With the default 4 operands of 10..49 a response is 26-29 tokens (+ end of turn) with the byte-level tokenizer:
a chain of 3 additions, each of which must be right, and each line must copy the running total and the next
operand. The reward (lab/tepo_lab/tiny/reward.py, the same file as the addition task) reads only the final answer,
the last integer of the response: sparse, no credit for a correct partial sum.

    python -m tepo_lab.tiny build --task scratchpad [--out DIR]

builds (or reuses) DIR/model (the tiny Qwen2 policy and the tokenizer), DIR/data/{train,val}.parquet in verl's
schema and DIR/manifest.json, like the addition task (lab/tepo_lab/tiny/build.py). The policy is the shipped one
(lab/tepo_lab/tiny/policies/scratchpad, the same start on every machine) when the spec is the default one;
`--retrain` (or a non-default spec) trains it here with a short supervised warm-up on the whole scratchpad.

The chain task (`--task chain`, ChainSpec) is the scratchpad with a varying number of operands (3 to 5 by
default), written `running_rest` (each line: the two operands, their sum, the rest of the sum), so responses run
from 20 to 58 tokens (+ end of turn): a chain of 2 to 4 additions. Longer chains are harder, which gives RL room
to improve for longer, and the lengths differ, which token-level aggregation needs to act on.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import ClassVar

from tepo_lab.tiny import common
from tepo_lab.tiny import tokenizer as tiny_tokenizer
from tepo_lab.tiny.common import (
    PolicySpec,
    build_cached,
    build_key,
    build_manifest,
    default_cache_root,
    encode_prompt,  # noqa: F401  (importable from here, as before the move)
    model_config,
    new_policy,
    responses_sha256,
    single_thread,
    supervised_batch,
    supervised_warm_up,
    write_data,
)

DATA_SOURCE = "tepo_tiny_scratchpad"
ABILITY = "math"
BUILDER_VERSION = 1
#: How a response carries the chain (see solution): "running" writes `total+next=new total` per operand,
#: "rewrite" rewrites the sum with its first two operands added, until one number is left, and "running_rest"
#: writes the running line followed by the rest of the sum.
SCRATCHPAD_STYLES = ("running", "rewrite", "running_rest")
#: Longest response the scratchpad of the default spec needs (29 tokens + end of turn), with room to ramble.
MAX_RESPONSE_TOKENS = 48


@dataclasses.dataclass(frozen=True)
class ScratchSpec(PolicySpec):
    #: the task's name (build key, shipped policy folder, --task) and the reward's data_source (verl's metric names)
    TASK: ClassVar[str] = "scratchpad"
    DATA_SOURCE: ClassVar[str] = DATA_SOURCE
    MAX_RESPONSE_TOKENS: ClassVar[int] = MAX_RESPONSE_TOKENS

    # the model and the warm-up's batch and learning rate: PolicySpec, the addition task's (149,568 parameters)
    # data: `operands` numbers drawn from operand_range (inclusive)
    operands: int = 4
    operand_range: tuple[int, int] = (10, 49)
    train_size: int = 2048
    val_size: int = 128
    # warm-up: supervised on the whole scratchpad (response tokens and the end of turn); the step count sets
    # where on the accuracy curve the RL runs start. The curve is steep: sampled (T=1) validation accuracy 0.06 at
    # 640 steps, 0.31 at 670 (greedy 0.52: the shipped policy's manifest), 0.39 at 700, 0.73 at 900.
    warmup_steps: int = 670

    def key(self) -> str:
        return build_key(self, task=self.TASK, builder=BUILDER_VERSION)

    def start_from(self) -> str:
        """The shipped policy the warm-up starts from ("": a seeded random init)."""
        return ""

    def operand_counts(self) -> int | tuple[int, int]:
        """How many operands a problem has: a number, or an inclusive (fewest, most) range drawn per problem."""
        return self.operands

    def style(self) -> str:
        """How the warm-up's target responses write the chain: one of SCRATCHPAD_STYLES."""
        return "running"

    def distinct_problems(self) -> int:
        counts = self.operand_counts()
        low, high = counts if isinstance(counts, tuple) else (counts, counts)
        return sum((self.operand_range[1] - self.operand_range[0] + 1) ** k for k in range(low, high + 1))


@dataclasses.dataclass(frozen=True)
class ChainSpec(ScratchSpec):
    """The chain task: 3 to 5 operands per problem (`min_operands` to `operands`), written `running_rest`,
    validated on 256 problems; the warm-up stops low on the accuracy curve (about a third of the validation problems
    right greedy, a sixth sampled)."""

    TASK: ClassVar[str] = "chain"
    DATA_SOURCE: ClassVar[str] = "tepo_tiny_chain"
    #: 5 operands need up to 58 tokens (+ end of turn) written running_rest, 6 written running 53: room to ramble
    MAX_RESPONSE_TOKENS: ClassVar[int] = 64
    min_operands: int = 3
    operands: int = 5
    val_size: int = 256
    # warm-up: from the shipped scratchpad policy (4 operands, written running), supervised on the chains until
    # just after its accuracy starts to climb, so every operand count has some right samples (docs/results.md)
    init_policy: str = "scratchpad"
    warmup_lr: float = 1e-3
    warmup_steps: int = 650
    # how a response writes the chain: one of SCRATCHPAD_STYLES (see solution); docs/results.md has the runs of each
    scratchpad: str = "running_rest"

    def __post_init__(self):
        check_style(self.scratchpad, "scratchpad")

    def operand_counts(self) -> tuple[int, int]:
        return (self.min_operands, self.operands)

    def style(self) -> str:
        return self.scratchpad

    def start_from(self) -> str:
        return self.init_policy


# ---------------------------------------------------------------------------------------------------- the task

def question(ops) -> str:
    return "What is " + "+".join(str(x) for x in ops) + "?"


def check_style(style: str, name: str = "style") -> None:
    if style not in SCRATCHPAD_STYLES:
        raise ValueError(f"{name} must be one of {', '.join(SCRATCHPAD_STYLES)}, got {style!r}")


def solution(ops, style: str = "running") -> str:
    """The scratchpad, one line per operand after the first; the last number is the answer.

    running:      `total+next=new total`            23+45=68 / 68+17=85 / 85+38=123
    rewrite:      the sum, first two added           68+17+38 / 85+38 / 123
    running_rest: the running line, then the rest   23+45=68+17+38 / 68+17=85+38 / 85+38=123
    A running line ends the chain only by counting the question's operands; a rewrite or running_rest line ends it
    when its sum is one number, which the line itself shows. A running or running_rest line writes each partial
    sum right after its two operands; a rewrite line writes it first, away from them."""
    check_style(style)
    if style == "running":
        lines, total = [], ops[0]
        for x in ops[1:]:
            lines.append(f"{total}+{x}={total + x}")
            total += x
        return "\n".join(lines)
    lines, rest = [], list(ops)  # rewrite, running_rest
    while len(rest) > 1:
        added = f"{rest[0]}+{rest[1]}=" if style == "running_rest" else ""
        rest = [rest[0] + rest[1], *rest[2:]]
        lines.append(added + "+".join(str(x) for x in rest))
    return "\n".join(lines)


def answer(ops) -> str:
    return str(sum(ops))


def draw(rng: random.Random, operands: int | tuple[int, int], operand_range) -> tuple:
    """One problem's operands: `operands` of them, or a count drawn from the inclusive range first."""
    count = rng.randint(*operands) if isinstance(operands, tuple) else operands
    return tuple(rng.randint(*operand_range) for _ in range(count))


def problems(count: int, seed: int, operands: int | tuple[int, int] = 4, operand_range=(10, 49),
             exclude=None) -> list[tuple]:
    """`count` distinct operand tuples, seeded; none from `exclude`."""
    rng = random.Random(seed)
    exclude = exclude or set()
    low, high = operands if isinstance(operands, tuple) else (operands, operands)
    width = operand_range[1] - operand_range[0] + 1
    available = sum(width ** k for k in range(low, high + 1)) - len(exclude)
    if count > available:
        raise ValueError(f"only {available} distinct problems are available, asked for {count}")
    seen: set[tuple] = set()
    out: list[tuple] = []
    while len(out) < count:
        ops = draw(rng, operands, operand_range)
        if ops in seen or ops in exclude:
            continue
        seen.add(ops)
        out.append(ops)
    return out


def row(ops, split: str, index: int, data_source: str = DATA_SOURCE) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question(ops)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer(ops)},
        "extra_info": {"split": split, "index": index, "operands": list(ops), "answer": answer(ops)},
    }


def split(spec: ScratchSpec) -> tuple[list[tuple], list[tuple]]:
    """(train, val) problems of the RL data, disjoint, seeded by spec.seed."""
    kw = {"operands": spec.operand_counts(), "operand_range": tuple(spec.operand_range)}
    val = problems(spec.val_size, seed=spec.seed * 1000 + 2, **kw)
    train = problems(spec.train_size, seed=spec.seed * 1000 + 1, exclude=set(val), **kw)
    return train, val


# ------------------------------------------------------------------------------------------- generation, scoring

def generate(model, tok, questions: list[str], temperature: float = 0.0, seed: int = 0,
             max_new_tokens: int = MAX_RESPONSE_TOKENS) -> tuple[list[list[int]], float]:
    """common.generate (one left-padded batch; the responses and the greedy top-two logit gap) with the
    scratchpad's response budget by default."""
    return common.generate(model, tok, questions, temperature, seed, max_new_tokens)


def evaluate(model, tok, problems_: list[tuple], temperature: float = 0.0, seed: int = 0,
             max_new_tokens: int = MAX_RESPONSE_TOKENS) -> dict:
    """Accuracy (the reward's mean), mean response length in tokens (the end of turn counted once when emitted),
    the greedy margin (see generate) and a sha256 of the decoded responses."""
    from tepo_lab.tiny.reward import compute_score

    responses, margin = generate(model, tok, [question(ops) for ops in problems_], temperature, seed,
                                 max_new_tokens)
    texts = [tok.decode(r) for r in responses]
    scores = [compute_score(DATA_SOURCE, text, answer(ops)) for text, ops in zip(texts, problems_)]
    lengths = [len(r) + (1 if len(r) < max_new_tokens else 0) for r in responses]
    return {
        "accuracy": sum(scores) / len(scores),
        "mean_response_tokens": sum(lengths) / len(lengths),
        "min_top2_logit_gap": margin,
        "responses_sha256": responses_sha256(texts),
    }


# ------------------------------------------------------------------------------------------------------ build

def start_policy(spec: ScratchSpec):
    """The policy the warm-up starts from: a seeded random init, or the shipped policy named by `init_policy`."""
    init = spec.start_from()
    if not init:
        return new_policy(spec)
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from tepo_lab.tiny import shipped

    with tempfile.TemporaryDirectory() as tmp:
        shipped.install(init, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    model.config.use_cache = False
    return model


def warm_up(spec: ScratchSpec, model_dir: Path, log=print, eval_every: int = 0, val=None,
            checkpoints: Path | None = None, stop_above: float | None = None, eval_from: int = 0) -> None:
    """Train the policy from a seeded random init into model_dir (call it under common.single_thread() for a
    build that is reproducible on one machine). The problems are fresh random ones, never a validation problem.

    To choose warmup_steps: eval_every > 0 logs the greedy and sampled validation accuracy every so many steps
    from step eval_from on (evaluation draws from its own generator, so it does not change the training), saves
    the model there into checkpoints/step-N when given, and stops once the sampled accuracy exceeds stop_above."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = start_policy(spec)
    exclude = set(val if val is not None else split(spec)[1])
    rng = random.Random(spec.seed * 1000 + 3)

    def next_batch():
        batch = []
        while len(batch) < spec.warmup_batch:
            ops = draw(rng, spec.operand_counts(), spec.operand_range)
            if ops not in exclude:
                batch.append(ops)
        return supervised_batch(tok, [(question(ops), solution(ops, spec.style())) for ops in batch])

    def evaluate_and_stop(step: int) -> bool:
        if not (eval_every and step % eval_every == 0 and step >= eval_from and val is not None):
            return False
        greedy = evaluate(model, tok, val, max_new_tokens=spec.MAX_RESPONSE_TOKENS)
        sampled = evaluate(model, tok, val, temperature=1.0, seed=spec.seed, max_new_tokens=spec.MAX_RESPONSE_TOKENS)
        model.train()
        log(f"[{spec.TASK}]   step {step}: greedy {greedy['accuracy']:.3f} sampled {sampled['accuracy']:.3f} "
            f"length {sampled['mean_response_tokens']:.1f}")
        if checkpoints is not None:  # saved as the final model is (use_cache on)
            model.config.use_cache = True
            model.save_pretrained(Path(checkpoints) / f"step-{step}", safe_serialization=True)
            model.config.use_cache = False
        return stop_above is not None and sampled["accuracy"] > stop_above

    supervised_warm_up(model, spec, next_batch, log, spec.TASK, after_step=evaluate_and_stop)
    model.save_pretrained(model_dir, safe_serialization=True)


def measure(model_dir: Path, spec: ScratchSpec) -> dict:
    """Greedy and sampled (T=1, seed spec.seed) validation accuracy of the policy in model_dir, single-threaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with single_thread():
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        val = split(spec)[1]
        greedy = evaluate(model, tok, val, max_new_tokens=spec.MAX_RESPONSE_TOKENS)
        sampled = evaluate(model, tok, val, temperature=1.0, seed=spec.seed, max_new_tokens=spec.MAX_RESPONSE_TOKENS)
    return {"greedy": greedy, "sampled": sampled,
            "parameters": sum(p.numel() for p in model.parameters())}


def shipped_measurements(model_dir: Path, spec: ScratchSpec) -> dict:
    """The measured fields of a shipped policy's manifest (lab/tepo_lab/tiny/shipped.py) for the policy in model_dir."""
    got = measure(model_dir, spec)
    greedy, sampled = got["greedy"], got["sampled"]
    return {"val_accuracy_greedy": greedy["accuracy"], "val_accuracy_sampled_t1": sampled["accuracy"],
            "val_mean_response_tokens_greedy": greedy["mean_response_tokens"],
            "val_mean_response_tokens_sampled_t1": sampled["mean_response_tokens"],
            "greedy_min_top2_logit_gap": greedy["min_top2_logit_gap"],
            "greedy_responses_sha256": greedy["responses_sha256"],
            "parameters": got["parameters"], "val_size": spec.val_size}


def _build_into(spec: ScratchSpec, out: Path, source: str | None, log) -> dict:
    from tepo_lab.tiny import shipped

    started = time.time()
    model_dir = out / "model"
    train, val = split(spec)
    write_data(out / "data", [row(ops, "train", i, spec.DATA_SOURCE) for i, ops in enumerate(train)],
               [row(ops, "test", i, spec.DATA_SOURCE) for i, ops in enumerate(val)])
    if source is not None:
        shipped.install(spec.TASK, model_dir)
        log(f"[{spec.TASK}] policy: the shipped one ({source})")
    else:
        tiny_tokenizer.save_tokenizer(model_dir)
        model_config(spec).save_pretrained(model_dir)
        with single_thread():
            warm_up(spec, model_dir, log, val=val)
    measured = measure(model_dir, spec)
    return {"task": spec.TASK,
            **build_manifest(spec, BUILDER_VERSION, source or "trained", measured["parameters"], started,
                             val_accuracy_greedy=measured["greedy"]["accuracy"],
                             val_accuracy_sampled_t1=measured["sampled"]["accuracy"],
                             val_mean_response_tokens_sampled_t1=measured["sampled"]["mean_response_tokens"])}


def default_out(spec: ScratchSpec) -> Path:
    return default_cache_root() / f"{spec.TASK}-{spec.key()}"


def build(out=None, spec: ScratchSpec | None = None, force: bool = False, retrain: bool = False, log=print) -> dict:
    """Build into `out` (default: the cache folder of spec's key) unless a build with the same key and policy
    source is there. Writes into a temporary sibling and renames, so an interrupted build never looks finished."""
    from tepo_lab.tiny import shipped

    spec = spec or ScratchSpec()
    out = Path(out) if out is not None else default_out(spec)
    source = None if retrain else shipped.source_for(spec.TASK, spec.key())
    return build_cached(out, spec.key(), source or "trained", lambda folder: _build_into(spec, folder, source, log),
                        force)
