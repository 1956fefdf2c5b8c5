"""What the tiny tasks' builders share (build.py: the addition task, scratchpad.py: the scratchpad task).

PolicySpec      the spec fields of the policy (seed, architecture, warm-up batch and learning rate); build_key
model_config    the tiny Qwen2 config (float32, head_dim 32 as vLLM's CPU attention needs)
warm-up         new_policy (a seeded random init), supervised_batch, supervised_warm_up (the AdamW loop)
decoding        encode_prompt, generate (one left-padded batch, greedy or seeded sampling)
build folder    write_data, build_manifest, build_cached (reuse a build of the same key, else build atomically),
                paths, default_cache_root

Everything that trains or measures runs under single_thread(): reproducible reductions on one machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tepo_lab.tiny import tokenizer as tiny_tokenizer

# ------------------------------------------------------------------------------------------------------- spec

@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """The fields of every task's spec that describe the policy; each task adds its data fields and warmup_steps."""

    seed: int = 0
    # model: 149,568 parameters (~150k; tied embeddings, vocabulary 278)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2  # head_dim = 32: vLLM's CPU attention refuses head_dim < 32
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    # warm-up: AdamW on batches of warmup_batch problems, the learning rate ramping up to warmup_lr over 20 steps
    warmup_batch: int = 64
    warmup_lr: float = 3e-3


def build_key(spec, **tags) -> str:
    """16 hex digits of the sha256 of the spec's fields and the tags (the builder version, the task): a build's id."""
    blob = json.dumps({**tags, **dataclasses.asdict(spec)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def model_config(spec: PolicySpec):
    from transformers import Qwen2Config

    tok = tiny_tokenizer.QWEN_SPECIAL_TOKENS
    return Qwen2Config(
        vocab_size=tiny_tokenizer.vocab_size(),
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


@contextlib.contextmanager
def single_thread():
    """Run torch on one thread (reproducible reductions), then restore the thread count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------- warm-up

def encode_prompt(tok, text: str) -> list[int]:
    """The token ids of the chat prompt asking `text`, up to the assistant's turn."""
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(chat, add_special_tokens=False)


def supervised_batch(tok, examples: list[tuple[str, str]]):
    """(input ids, labels, attention mask) of prompt + target + end of turn sequences for (question, target) pairs:
    left-aligned, padded on the right, labels on the target and the end of turn only."""
    import torch

    eos_id = tok.convert_tokens_to_ids(tiny_tokenizer.EOS_TOKEN)
    seqs, labels = [], []
    for question, target_text in examples:
        prompt = encode_prompt(tok, question)
        target = tok.encode(target_text, add_special_tokens=False) + [eos_id]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
        mask[i, : len(s)] = 1
    return ids, lab, mask


def new_policy(spec: PolicySpec):
    """The randomly initialised policy, seeded with spec.seed (torch's global generator), KV cache off for training."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(model_config(spec)).float()
    model.config.use_cache = False
    return model


def supervised_warm_up(model, spec, next_batch: Callable[[], tuple], log, name: str,
                       after_step: Callable[[int], bool] | None = None) -> None:
    """spec.warmup_steps AdamW steps on next_batch() (a supervised_batch), the learning rate ramping up to
    spec.warmup_lr over the first 20 steps, gradients clipped to norm 1. after_step(step) runs after each step
    (counted from 1) and ends the warm-up by returning True. Leaves the model's KV cache on, as it is saved."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    model.train()
    for step in range(1, spec.warmup_steps + 1):
        ids, labels, mask = next_batch()
        for group in optimizer.param_groups:
            group["lr"] = spec.warmup_lr * min(1.0, step / 20)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == spec.warmup_steps:
            log(f"[{name}] warm-up step {step}/{spec.warmup_steps} loss {loss.item():.3f}")
        if after_step is not None and after_step(step):
            break
    model.config.use_cache = True


# --------------------------------------------------------------------------------------------------- decoding

def generate(model, tok, questions: list[str], temperature: float, seed: int,
             max_new_tokens: int) -> tuple[list[list[int]], float]:
    """Decode every question in one left-padded batch (greedy when temperature == 0, else sampled with a seeded
    generator), with the KV cache: the prompt in one forward pass, then one token per sequence a step. Returns the
    response token ids (up to and without the end of turn) and, for greedy decoding, the smallest gap between the
    top two logits over every token chosen (inf when sampling): a gap far above float rounding means a last-bit
    difference in the logits (from another CPU, or from the cache's shapes) cannot change any greedy choice."""
    import torch

    eos_id = tok.convert_tokens_to_ids(tiny_tokenizer.EOS_TOKEN)
    generator = torch.Generator().manual_seed(seed)
    prompts = [encode_prompt(tok, q) for q in questions]
    width = max(map(len, prompts))
    # Left-pad so every prompt ends at the same position.
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in prompts]
    margin = float("inf")
    model.eval()
    step_ids, positions, cache = ids, (mask.cumsum(-1) - 1).clamp(min=0), None  # [B, width] each, then [B, 1]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            output = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                           use_cache=True)
            cache, logits = output.past_key_values, output.logits[:, -1].float()  # logits: [B, vocab]
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
            step_ids, positions = nxt[:, None], positions[:, -1:] + 1
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if bool(done.all()):
                break
    return out, margin


def responses_sha256(texts: list[str]) -> str:
    """A digest of decoded responses, to record and later reproduce exactly what a policy answered."""
    return hashlib.sha256("\n\x00".join(texts).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------- build folder

def default_cache_root() -> Path:
    root = os.environ.get("TEPO_VERL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tepo-verl"
    )
    return Path(root) / "tiny"


def paths(out: Path) -> dict:
    from tepo_lab.tiny import reward

    return {
        "model": str(out / "model"),
        "train": str(out / "data" / "train.parquet"),
        "val": str(out / "data" / "val.parquet"),
        "reward": str(Path(reward.__file__).resolve()),
        "reward_name": "compute_score",
    }


def write_data(data_dir: Path, train_rows: list[dict], val_rows: list[dict]) -> None:
    """The RL prompts in verl's schema: data_dir/train.parquet and data_dir/val.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(train_rows), data_dir / "train.parquet")
    pq.write_table(pa.Table.from_pylist(val_rows), data_dir / "val.parquet")


def build_manifest(spec, builder_version: int, policy: str, parameters: int, started: float, **measured) -> dict:
    """The manifest fields every build records; `measured` adds the task's own (its validation accuracies)."""
    return {
        "key": spec.key(),
        "spec": dataclasses.asdict(spec),
        "builder_version": builder_version,
        "policy": policy,
        "parameters": parameters,
        "vocab_size": tiny_tokenizer.vocab_size(),
        **measured,
        "build_seconds": round(time.time() - started, 1),
    }


def build_cached(out: Path, key: str, policy: str, build_into: Callable[[Path], dict], force: bool = False) -> dict:
    """The manifest of the build in `out` if it has this key and policy source (and not `force`), else of a fresh
    build_into(folder), which fills the folder and returns the manifest. The fresh build goes into a temporary
    sibling that is renamed to `out` once complete, so an interrupted build never looks finished. The returned
    manifest adds its `paths` and whether it was `cached`."""
    manifest_path = out / "manifest.json"
    if not force and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("key") == key and manifest.get("policy", "trained") == policy:
            return {**manifest, "paths": paths(out), "cached": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        manifest = build_into(tmp)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**manifest, "paths": paths(out), "cached": False}
