"""The scratchpad task: multi-operand addition where the model writes its partial sums before the answer.

    What is 23+45+17+38?  ->  23+45=68
                              68+17=85
                              85+38=123

With the default 4 operands of 10..49 a response is 26-29 tokens (+ end of turn) with the byte-level tokenizer:
a chain of 3 additions, each of which must be right, and each line must copy the running total and the next
operand. The reward (tepo_verl/tiny/reward.py, the same file as the addition task) reads only the final answer,
the last integer of the response: sparse, no credit for a correct partial sum.

    python -m tepo_verl.tiny build --task scratchpad [--out DIR]

builds (or reuses) DIR/model (the tiny Qwen2 policy and the tokenizer), DIR/data/{train,val}.parquet in verl's
schema and DIR/manifest.json, like the addition task (tepo_verl/tiny/build.py). The policy is the shipped one
(tepo_verl/tiny/policies/scratchpad, the same start on every machine) when the spec is the default one;
`--retrain` (or a non-default spec) trains it here with a short supervised warm-up on the whole scratchpad.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from tepo_verl.tiny import tokenizer as tiny_tokenizer

DATA_SOURCE = "tepo_tiny_scratchpad"
ABILITY = "math"
BUILDER_VERSION = 1
#: Longest response the scratchpad of the default spec needs (29 tokens + end of turn), with room to ramble.
MAX_RESPONSE_TOKENS = 48


@dataclasses.dataclass(frozen=True)
class ScratchSpec:
    seed: int = 0
    # model: the addition task's architecture (149,568 parameters, head_dim 32 for vLLM's CPU attention)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    # data: `operands` numbers drawn from operand_range (inclusive)
    operands: int = 4
    operand_range: tuple[int, int] = (10, 49)
    train_size: int = 2048
    val_size: int = 128
    # warm-up: supervised on the whole scratchpad (response tokens and the end of turn); the step count sets
    # where on the accuracy curve the RL runs start. The curve is steep: sampled (T=1) validation accuracy 0.06 at
    # 640 steps, 0.31 at 670 (greedy 0.52: the shipped policy's manifest), 0.39 at 700, 0.73 at 900.
    warmup_steps: int = 670
    warmup_batch: int = 64
    warmup_lr: float = 3e-3

    def key(self) -> str:
        blob = json.dumps({"task": "scratchpad", "builder": BUILDER_VERSION, **dataclasses.asdict(self)},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def distinct_problems(self) -> int:
        return (self.operand_range[1] - self.operand_range[0] + 1) ** self.operands


# ---------------------------------------------------------------------------------------------------- the task

def question(ops) -> str:
    return "What is " + "+".join(str(x) for x in ops) + "?"


def solution(ops) -> str:
    """The scratchpad: one line `total+next=new total` per operand after the first; the last number is the answer."""
    lines, total = [], ops[0]
    for x in ops[1:]:
        lines.append(f"{total}+{x}={total + x}")
        total += x
    return "\n".join(lines)


def answer(ops) -> str:
    return str(sum(ops))


def problems(count: int, seed: int, operands: int = 4, operand_range=(10, 49), exclude=None) -> list[tuple]:
    """`count` distinct operand tuples, seeded; none from `exclude`."""
    rng = random.Random(seed)
    exclude = exclude or set()
    available = (operand_range[1] - operand_range[0] + 1) ** operands - len(exclude)
    if count > available:
        raise ValueError(f"only {available} distinct problems are available, asked for {count}")
    seen: set[tuple] = set()
    out: list[tuple] = []
    while len(out) < count:
        ops = tuple(rng.randint(*operand_range) for _ in range(operands))
        if ops in seen or ops in exclude:
            continue
        seen.add(ops)
        out.append(ops)
    return out


def row(ops, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question(ops)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer(ops)},
        "extra_info": {"split": split, "index": index, "operands": list(ops), "answer": answer(ops)},
    }


def split(spec: ScratchSpec) -> tuple[list[tuple], list[tuple]]:
    """(train, val) problems of the RL data, disjoint, seeded by spec.seed."""
    kw = {"operands": spec.operands, "operand_range": tuple(spec.operand_range)}
    val = problems(spec.val_size, seed=spec.seed * 1000 + 2, **kw)
    train = problems(spec.train_size, seed=spec.seed * 1000 + 1, exclude=set(val), **kw)
    return train, val


# ------------------------------------------------------------------------------------------- generation, scoring

def encode_prompt(tok, text: str) -> list[int]:
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(chat, add_special_tokens=False)


def generate(model, tok, questions: list[str], temperature: float = 0.0, seed: int = 0,
             max_new_tokens: int = MAX_RESPONSE_TOKENS) -> tuple[list[list[int]], float]:
    """Decode every question in one left-padded batch (greedy when temperature == 0, else sampled with a seeded
    generator). Returns the response token ids (up to and without the end of turn) and, for greedy decoding, the
    smallest gap between the top two logits over every token chosen (inf when sampling): a gap far above float
    rounding means a last-bit difference in the logits cannot change any greedy choice."""
    import torch

    eos_id = tok.convert_tokens_to_ids(tiny_tokenizer.EOS_TOKEN)
    generator = torch.Generator().manual_seed(seed)
    prompts = [encode_prompt(tok, q) for q in questions]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in prompts]
    margin = float("inf")
    model.eval()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                nxt = logits.argmax(-1)
                top2 = logits.topk(2, dim=-1).values
                gaps = (top2[:, 0] - top2[:, 1])[~done]
                if gaps.numel():
                    margin = min(margin, float(gaps.min()))
            for i, token in enumerate(nxt.tolist()):
                if not done[i]:
                    if token == eos_id:
                        done[i] = True
                    else:
                        out[i].append(token)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if bool(done.all()):
                break
    return out, margin


def evaluate(model, tok, problems_: list[tuple], temperature: float = 0.0, seed: int = 0,
             max_new_tokens: int = MAX_RESPONSE_TOKENS) -> dict:
    """Accuracy (the reward's mean), mean response length in tokens (the end of turn counted once when emitted),
    the greedy margin (see generate) and a sha256 of the decoded responses."""
    from tepo_verl.tiny.reward import compute_score

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


def responses_sha256(texts: list[str]) -> str:
    return hashlib.sha256("\n\x00".join(texts).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------------ build

def _batch(tok, problems_, eos_id: int, pad_id: int):
    import torch

    seqs, labels = [], []
    for ops in problems_:
        prompt = encode_prompt(tok, question(ops))
        target = tok.encode(solution(ops), add_special_tokens=False) + [eos_id]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
        mask[i, : len(s)] = 1
    return ids, lab, mask


def warm_up(spec: ScratchSpec, model_dir: Path, log=print, eval_every: int = 0, val=None,
            checkpoints: Path | None = None, stop_above: float | None = None, eval_from: int = 0) -> None:
    """Train the policy from a seeded random init into model_dir (single-threaded: reproducible on one machine).

    To choose warmup_steps: eval_every > 0 logs the greedy and sampled validation accuracy every so many steps
    from step eval_from on (evaluation draws from its own generator, so it does not change the training), saves
    the model there into checkpoints/step-N when given, and stops once the sampled accuracy exceeds stop_above."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from tepo_verl.tiny.build import _model_config

    tok = AutoTokenizer.from_pretrained(model_dir)
    config = _model_config(spec)
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).float()
    model.config.use_cache = False
    # warm-up problems: fresh random problems, never a validation problem
    exclude = set(val if val is not None else split(spec)[1])
    rng = random.Random(spec.seed * 1000 + 3)
    eos_id = tok.convert_tokens_to_ids(tiny_tokenizer.EOS_TOKEN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    model.train()
    for step in range(spec.warmup_steps):
        batch = []
        while len(batch) < spec.warmup_batch:
            ops = tuple(rng.randint(*spec.operand_range) for _ in range(spec.operands))
            if ops not in exclude:
                batch.append(ops)
        ids, labels, mask = _batch(tok, batch, eos_id, tok.pad_token_id)
        for group in optimizer.param_groups:
            group["lr"] = spec.warmup_lr * min(1.0, (step + 1) / 20)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0 or step + 1 == spec.warmup_steps:
            log(f"[scratchpad] warm-up step {step + 1}/{spec.warmup_steps} loss {loss.item():.3f}")
        if eval_every and (step + 1) % eval_every == 0 and step + 1 >= eval_from and val is not None:
            greedy = evaluate(model, tok, val)
            sampled = evaluate(model, tok, val, temperature=1.0, seed=spec.seed)
            model.train()
            log(f"[scratchpad]   step {step + 1}: greedy {greedy['accuracy']:.3f} sampled {sampled['accuracy']:.3f} "
                f"length {sampled['mean_response_tokens']:.1f}")
            if checkpoints is not None:  # saved as the final model is (use_cache on)
                model.config.use_cache = True
                model.save_pretrained(Path(checkpoints) / f"step-{step + 1}", safe_serialization=True)
                model.config.use_cache = False
            if stop_above is not None and sampled["accuracy"] > stop_above:
                break
    model.config.use_cache = True
    model.save_pretrained(model_dir, safe_serialization=True)


def measure(model_dir: Path, spec: ScratchSpec) -> dict:
    """Greedy and sampled (T=1, seed spec.seed) validation accuracy of the policy in model_dir, single-threaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        val = split(spec)[1]
        greedy = evaluate(model, tok, val)
        sampled = evaluate(model, tok, val, temperature=1.0, seed=spec.seed)
    finally:
        torch.set_num_threads(threads)
    return {"greedy": greedy, "sampled": sampled,
            "parameters": sum(p.numel() for p in model.parameters())}


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def _build_into(spec: ScratchSpec, out: Path, retrain: bool, log) -> dict:
    import torch

    from tepo_verl.tiny import shipped
    from tepo_verl.tiny.build import _model_config

    started = time.time()
    model_dir, data_dir = out / "model", out / "data"
    train, val = split(spec)
    data_dir.mkdir(parents=True, exist_ok=True)
    _write_parquet([row(ops, "train", i) for i, ops in enumerate(train)], data_dir / "train.parquet")
    _write_parquet([row(ops, "test", i) for i, ops in enumerate(val)], data_dir / "val.parquet")
    source = None if retrain else shipped.source_for("scratchpad", spec.key())
    if source is not None:
        shipped.install("scratchpad", model_dir)
        log(f"[scratchpad] policy: the shipped one ({source})")
    else:
        tiny_tokenizer.save_tokenizer(model_dir)
        _model_config(spec).save_pretrained(model_dir)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # reproducible reductions
        try:
            warm_up(spec, model_dir, log, val=val)
        finally:
            torch.set_num_threads(threads)
    measured = measure(model_dir, spec)
    return {
        "task": "scratchpad",
        "key": spec.key(),
        "spec": dataclasses.asdict(spec),
        "builder_version": BUILDER_VERSION,
        "policy": source or "trained",
        "parameters": measured["parameters"],
        "vocab_size": tiny_tokenizer.vocab_size(),
        "val_accuracy_greedy": measured["greedy"]["accuracy"],
        "val_accuracy_sampled_t1": measured["sampled"]["accuracy"],
        "val_mean_response_tokens_sampled_t1": measured["sampled"]["mean_response_tokens"],
        "build_seconds": round(time.time() - started, 1),
    }


def default_out(spec: ScratchSpec) -> Path:
    from tepo_verl.tiny.build import default_cache_root

    return default_cache_root() / f"scratchpad-{spec.key()}"


def build(out=None, spec: ScratchSpec | None = None, force: bool = False, retrain: bool = False, log=print) -> dict:
    """Build into `out` (default: the cache folder of spec's key) unless a build with the same key and policy
    source is there. Writes into a temporary sibling and renames, so an interrupted build never looks finished."""
    from tepo_verl.tiny import shipped
    from tepo_verl.tiny.build import paths

    spec = spec or ScratchSpec()
    out = Path(out) if out is not None else default_out(spec)
    wanted = "trained" if retrain else (shipped.source_for("scratchpad", spec.key()) or "trained")
    manifest_path = out / "manifest.json"
    if not force and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("key") == spec.key() and manifest.get("policy") == wanted:
            return {**manifest, "paths": paths(out), "cached": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        manifest = _build_into(spec, tmp, retrain, log)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**manifest, "paths": paths(out), "cached": False}
