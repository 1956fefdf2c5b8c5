"""Build (offline, seeded, cached) a tiny Qwen2 policy and the addition task for CPU runs of verl.

    python -m tepo_verl.tiny build --out DIR      # or without --out: ~/.cache/tepo-verl/tiny/<key>

DIR/model/      Qwen2ForCausalLM (safetensors, float32, head_dim 32 as vLLM's CPU attention needs) and the
                byte-level tokenizer with Qwen's special tokens and ChatML chat template
DIR/data/       train.parquet, val.parquet in verl's schema
DIR/manifest.json   paths (incl. the reward file), sizes, the warm-up accuracy, the build key

The policy is a short supervised warm-up (plain torch, answer tokens only) of a random model, stopped early so
that it is right sometimes but not always, like a base model: its sampled (T=1) accuracy is measured on the
validation problems and recorded in the manifest. Everything is seeded and runs single-threaded, so a build is
byte-for-byte reproducible on one machine; a finished build is reused when its key (all parameters + builder
version) matches. Across machines the warm-up differs in its last bits, so for the default spec the builder copies
the policy shipped in the package (tepo_verl/tiny/policies/addition, see shipped.py) instead of training:
the same start everywhere. `--retrain` trains it here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from tepo_verl.tiny import task
from tepo_verl.tiny import tokenizer as tiny_tokenizer

BUILDER_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TinySpec:
    seed: int = 0
    # model: 149,568 parameters (~150k; tied embeddings, vocabulary 278)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2  # head_dim = 32: vLLM's CPU attention refuses head_dim < 32
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    # data: a + b with a, b drawn from these inclusive ranges
    a_range: tuple[int, int] = (10, 49)
    b_range: tuple[int, int] = (10, 49)
    train_size: int = 1024
    val_size: int = 128
    # warm-up: with the default operands 10..49, 800 steps gives 27% sampled (T=1) accuracy on the validation
    # problems (measured at build time and recorded in the manifest). The accuracy climbs steeply with the
    # step count, so the step count sets where on that curve the RL runs start.
    warmup_steps: int = 800
    warmup_batch: int = 64
    warmup_lr: float = 3e-3

    def key(self) -> str:
        blob = json.dumps({"builder": BUILDER_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_root() -> Path:
    root = os.environ.get("TEPO_VERL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tepo-verl"
    )
    return Path(root) / "tiny"


def _model_config(spec: TinySpec):
    from transformers import Qwen2Config

    vocab_size = tiny_tokenizer.vocab_size()
    tok = tiny_tokenizer.QWEN_SPECIAL_TOKENS
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=256 + tok.index(tiny_tokenizer.PAD_TOKEN),
        eos_token_id=256 + tok.index(tiny_tokenizer.EOS_TOKEN),
        pad_token_id=256 + tok.index(tiny_tokenizer.PAD_TOKEN),
        torch_dtype="float32",
    )


def _encode_prompt(tok, a: int, b: int) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": task.question(a, b)}], add_generation_prompt=True,
                                   tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def _batch(tok, pairs, eos_id: int, pad_id: int):
    """Left-aligned prompt+answer+eos sequences, labels on the answer and eos only."""
    import torch

    seqs, labels = [], []
    for a, b in pairs:
        prompt = _encode_prompt(tok, a, b)
        answer = tok.encode(str(a + b), add_special_tokens=False) + [eos_id]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
        mask[i, : len(s)] = 1
    return ids, lab, mask


def sample_accuracy(model, tok, pairs, seed: int, temperature: float = 1.0, max_new_tokens: int = 6) -> float:
    """Share of problems whose sampled (temperature>0) or greedy (0) answer gets reward 1."""
    import torch

    from tepo_verl.tiny.reward import compute_score

    eos_id = tok.convert_tokens_to_ids(tiny_tokenizer.EOS_TOKEN)
    generator = torch.Generator().manual_seed(seed)
    prompts = [_encode_prompt(tok, a, b) for a, b in pairs]
    width = max(map(len, prompts))
    # Left-pad so every prompt ends at the same position.
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out = [[] for _ in prompts]
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
    scores = [compute_score(task.DATA_SOURCE, tok.decode(o), str(a + b)) for o, (a, b) in zip(out, pairs)]
    return sum(scores) / len(scores)


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def _build_into(spec: TinySpec, out: Path, log, source: str | None = None) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from tepo_verl.tiny import shipped

    started = time.time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible reductions
    try:
        model_dir, data_dir = out / "model", out / "data"
        tiny_tokenizer.save_tokenizer(model_dir)
        config = _model_config(spec)
        config.save_pretrained(model_dir)
        tok = AutoTokenizer.from_pretrained(model_dir)

        # data: RL train / val prompts, and disjoint warm-up problems
        ranges = {"a_range": tuple(spec.a_range), "b_range": tuple(spec.b_range)}
        val_pairs = task.problems(spec.val_size, seed=spec.seed * 1000 + 2, **ranges)
        train_pairs = task.problems(spec.train_size, seed=spec.seed * 1000 + 1, exclude=set(val_pairs), **ranges)
        data_dir.mkdir(parents=True, exist_ok=True)
        _write_parquet([task.row(a, b, "train", i) for i, (a, b) in enumerate(train_pairs)], data_dir / "train.parquet")
        _write_parquet([task.row(a, b, "test", i) for i, (a, b) in enumerate(val_pairs)], data_dir / "val.parquet")

        # model + supervised warm-up on problems that are not validation problems (none with a shipped policy)
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config).float()
        model.config.use_cache = False
        val_set = set(val_pairs)
        warm_pairs = [pair for pair in task.all_problems(**ranges) if pair not in val_set]
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
        eos_id = tok.convert_tokens_to_ids(tiny_tokenizer.EOS_TOKEN)
        rng = torch.Generator().manual_seed(spec.seed)
        model.train()
        for step in range(spec.warmup_steps if source is None else 0):
            pick = torch.randint(len(warm_pairs), (spec.warmup_batch,), generator=rng).tolist()
            ids, labels, mask = _batch(tok, [warm_pairs[i] for i in pick], eos_id, tok.pad_token_id)
            lr = spec.warmup_lr * min(1.0, (step + 1) / 20)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if (step + 1) % 100 == 0 or step + 1 == spec.warmup_steps:
                log(f"[tiny] warm-up step {step + 1}/{spec.warmup_steps} loss {loss.item():.3f}")
        model.config.use_cache = True
        if source is None:
            model.save_pretrained(model_dir, safe_serialization=True)
        else:  # the policy shipped for this key (tepo_verl/tiny/shipped.py): the same start on every machine
            shipped.install("addition", model_dir)
            model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            log(f"[tiny] policy: the shipped one ({source})")

        sampled = sample_accuracy(model, tok, val_pairs, seed=spec.seed, temperature=1.0)
        greedy = sample_accuracy(model, tok, val_pairs, seed=spec.seed, temperature=0.0)
    finally:
        torch.set_num_threads(threads)
    manifest = {
        "key": spec.key(),
        "spec": dataclasses.asdict(spec),
        "builder_version": BUILDER_VERSION,
        "policy": source or "trained",
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "val_accuracy_sampled_t1": sampled,
        "val_accuracy_greedy": greedy,
        "build_seconds": round(time.time() - started, 1),
    }
    return manifest


def paths(out: Path) -> dict:
    from tepo_verl.tiny import reward

    return {
        "model": str(out / "model"),
        "train": str(out / "data" / "train.parquet"),
        "val": str(out / "data" / "val.parquet"),
        "reward": str(Path(reward.__file__).resolve()),
        "reward_name": "compute_score",
    }


def build(out: str | Path | None = None, spec: TinySpec | None = None, force: bool = False, log=print,
          retrain: bool = False) -> dict:
    """Build into `out` (default: the cache dir for spec's key) unless a build with the same key and policy
    source is there. The policy is the shipped one when one is shipped for spec's key, unless `retrain`.

    Returns the manifest with its `paths`. Writes into a temporary sibling and renames, so an interrupted
    build never looks finished.
    """
    from tepo_verl.tiny import shipped

    spec = spec or TinySpec()
    out = Path(out) if out is not None else default_cache_root() / spec.key()
    source = None if retrain else shipped.source_for("addition", spec.key())
    manifest_path = out / "manifest.json"
    if not force and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("key") == spec.key() and manifest.get("policy", "trained") == (source or "trained"):
            manifest["paths"] = paths(out)
            manifest["cached"] = True
            return manifest
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        manifest = _build_into(spec, tmp, log, source)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest["paths"] = paths(out)
    manifest["cached"] = False
    return manifest
