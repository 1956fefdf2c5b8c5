"""The GPU questions tepo-verl cannot answer on CPU, in one short script (a few minutes on one GPU).

    python benchmarks/gpu_check.py                     # on CUDA: full sizes; without CUDA: the tiny sizes
    python benchmarks/gpu_check.py --tiny              # tiny sizes anywhere (what the test suite runs, on CPU)
    python benchmarks/gpu_check.py --out $OUT          # also writes gpu_check.json there

It needs torch and transformers only; no vLLM, Ray or verl trainer. Where verl imports, its own functions are
used (`verl/utils/torch_functional.py:logprobs_from_logits`, `entropy_from_logits`,
`verl/utils/experimental/torch_functional.py:_fused_linear_for_ppo_fwd`, `core_algos` GSPO); where it does not
(a bare GPU machine), the same code paths are replicated here from verl 0.9.1 and every line says which ran.

1. dtype: the log-prob and entropy dtypes verl's functions return on bf16 logits inside `torch.autocast(bf16)`,
   as verl's FSDP engine calls them (`FSDPEngineWithLMHead.forward_step`): with flash-attn's cross-entropy if it
   imports, and without it (`VERL_DISABLE_FLASH_ATTN_CE=1`); and verl's fused-kernel torch backend.
2. on-policy noise: a random Qwen2-architecture model in bf16 (Qwen2.5-0.5B's shape on CUDA) scores the same
   sequences in two micro-batch packings (different batch sizes and order, as the old-log-prob pass and the update
   differ); the token and sequence log-ratios between the two are what the first update's ratio sees instead of
   exactly 0. Reported as quantiles of |log-ratio| and the share above the 3e-4 clip.
3. loss cost: the TEPO loss (its preset: stored old entropy, `surprisal_old`) and GSPO's, each behind the
   151,936-row lm-head and verl's log-probs, forward and backward in bf16 autocast on 16k tokens, interleaved
   repetitions: median time and peak memory side by side. The last line is

    gpu tepo/gspo time=<r> memory=<r>
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tepo_verl.core (pure torch) without installing the package

from tepo_verl.core.loss import tepo_policy_loss, token_mean  # noqa: E402
from tepo_verl.core.options import TepoOptions  # noqa: E402

CLIP_LOW, CLIP_HIGH = 3e-4, 4e-4  # GSPO's and TEPO's preset clip range
VOCAB = 151936
FULL = dict(vocab=VOCAB, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, sequences=32,
            max_len=1024, loss_tokens=16384, loss_hidden=896, repeats=10)  # Qwen2.5-0.5B's shape
TINY = dict(vocab=1024, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, sequences=8, max_len=48,
            loss_tokens=1024, loss_hidden=64, repeats=3, loss_vocab=4096)


# --------------------------------------------------------------------------------------------- verl's functions


def _replica_logprobs(logits, labels, inplace_backward=True):
    """verl 0.9.1 logprobs_from_logits without flash-attn: logprobs_from_logits_v2's bf16 branch."""
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    return torch.stack([F.log_softmax(row, dim=-1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
                        for row, lab in zip(logits, labels, strict=True)])


def _replica_entropy(logits):
    """verl 0.9.1 entropy_from_logits."""
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def _replica_fused(hidden, weight, labels, temperature=1.0):
    """verl 0.9.1 _fused_linear_for_ppo_fwd without flash-attn (the torch backend)."""
    logits = (hidden @ weight.t()) / temperature
    orig = logits.dtype
    logits = logits.to(torch.float32)
    probs = logits.softmax(dim=-1)
    entropy = torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)
    return logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy.to(orig)


def verl_functions() -> dict:
    """verl's functions when verl imports, else the replicas; `source` says which."""
    try:
        import verl
        from verl.utils import torch_functional as vf
        from verl.utils.experimental.torch_functional import _fused_linear_for_ppo_fwd

        return dict(source=f"verl {verl.__version__}", logprobs=vf.logprobs_from_logits, entropy=vf.entropy_from_logits,
                    fused=_fused_linear_for_ppo_fwd, flash_ce=bool(vf.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE))
    except Exception as error:  # noqa: BLE001 - any import failure means: use the replicas
        try:
            import flash_attn.ops.triton.cross_entropy  # noqa: F401

            flash = True
        except Exception:  # noqa: BLE001
            flash = False
        return dict(source=f"replicas of verl 0.9.1 (verl does not import: {type(error).__name__})",
                    logprobs=_replica_logprobs, entropy=_replica_entropy, fused=_replica_fused, flash_ce=flash,
                    replica=True)


@contextlib.contextmanager
def flash_ce(enabled: bool):
    """verl reads VERL_DISABLE_FLASH_ATTN_CE at each call of logprobs_from_logits."""
    old = os.environ.get("VERL_DISABLE_FLASH_ATTN_CE")
    os.environ["VERL_DISABLE_FLASH_ATTN_CE"] = "0" if enabled else "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VERL_DISABLE_FLASH_ATTN_CE")
        else:
            os.environ["VERL_DISABLE_FLASH_ATTN_CE"] = old


def autocast(device: torch.device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------------------------ 1. dtype


def check_dtypes(fns: dict, device: torch.device, vocab: int, hidden: int) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(64, hidden, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(device, torch.bfloat16)
    labels = torch.randint(0, vocab, (64,), generator=g).to(device)
    results = {}
    paths = [("log_softmax", False)] + ([("flash-attn cross-entropy", True)] if fns["flash_ce"] and not fns.get(
        "replica") else [])
    with autocast(device):
        logits = F.linear(h, w)  # (N, V), bf16 under autocast, as the lm-head's output
        for name, use_flash in paths:
            with flash_ce(use_flash):
                lp = fns["logprobs"](logits, labels)
            results[f"logprobs_from_logits ({name})"] = str(lp.dtype)
        results["entropy_from_logits"] = str(fns["entropy"](logits).dtype)
        lp, ent = fns["fused"](h, w, labels)
        results["fused kernels, torch backend: log-probs"] = str(lp.dtype)
        results["fused kernels, torch backend: entropy"] = str(ent.dtype)
    results["logits"] = str(logits.dtype)
    if fns["flash_ce"] and fns.get("replica"):
        results["note"] = "flash-attn imports but verl does not: its cross-entropy path was not run"
    elif not fns["flash_ce"]:
        results["note"] = "flash-attn's cross-entropy does not import here: only the log_softmax path ran"
    return results


# --------------------------------------------------------------------------------------------- 2. on-policy noise


def random_qwen2(size: dict, device: torch.device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                         num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                         num_key_value_heads=size["kv_heads"], max_position_embeddings=4096,
                         tie_word_embeddings=size["vocab"] < VOCAB, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: a 0.5B model's init is slow on CPU
        return Qwen2ForCausalLM(config).to(torch.bfloat16).eval()  # FSDP's bf16 param_dtype


def score(model, fns, sequences, response_lens, order, micro, device) -> list[torch.Tensor]:
    """Response-token log-probs of each sequence, computed micro-batch by micro-batch in `order` (right-padded
    to each micro-batch's longest sequence), as verl's engine does."""
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for start in range(0, len(order), micro):
        ids = order[start:start + micro]
        width = max(len(sequences[i]) for i in ids)
        input_ids = torch.zeros(len(ids), width, dtype=torch.long, device=device)
        attention = torch.zeros(len(ids), width, dtype=torch.long, device=device)
        for row, i in enumerate(ids):
            input_ids[row, :len(sequences[i])] = sequences[i]
            attention[row, :len(sequences[i])] = 1
        with torch.no_grad(), autocast(device):
            logits = model(input_ids=input_ids, attention_mask=attention).logits  # (b, L, V)
            for row, i in enumerate(ids):
                n, r = len(sequences[i]), response_lens[i]
                lp = fns["logprobs"](logits[row, n - r - 1:n - 1], input_ids[row, n - r:n])  # (r,)
                out[i] = lp.float().cpu()
    return out


def quantiles(values: torch.Tensor) -> dict:
    a = values.abs().double()
    q = torch.quantile(a, torch.tensor([0.5, 0.9, 0.99], dtype=torch.double))
    return {"median": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": float(a.max()),
            "share_above_clip": float((a > CLIP_LOW).double().mean()), "n": int(a.numel())}


def check_noise(fns: dict, size: dict, device: torch.device) -> dict:
    model = random_qwen2(size, device)
    g = torch.Generator().manual_seed(1)
    n = size["sequences"]
    lengths = torch.randint(size["max_len"] // 2, size["max_len"] + 1, (n,), generator=g).tolist()
    sequences = [torch.randint(0, size["vocab"], (length,), generator=g).to(device) for length in lengths]
    response_lens = [length - length // 4 for length in lengths]  # a quarter prompt, the rest response
    order_a = list(range(n))
    order_b = torch.randperm(n, generator=g).tolist()
    first = score(model, fns, sequences, response_lens, order_a, max(1, n // 8), device)  # the old-log-prob pass
    second = score(model, fns, sequences, response_lens, order_b, max(1, n // 4), device)  # the update's packing
    token = torch.cat([b - a for a, b in zip(first, second, strict=True)])
    sequence = torch.stack([(b - a).mean() for a, b in zip(first, second, strict=True)])
    same = torch.equal(torch.cat(first), torch.cat(score(model, fns, sequences, response_lens, order_a,
                                                         max(1, n // 8), device)))
    return {"token_log_ratio": quantiles(token), "sequence_log_ratio": quantiles(sequence),
            "same_packing_bit_identical": same, "packings": f"{max(1, n // 8)} in order vs {max(1, n // 4)} shuffled",
            "model": {k: size[k] for k in ("vocab", "hidden", "layers")}, "sequences": n,
            "tokens": sum(response_lens)}


# ------------------------------------------------------------------------------------------------- 3. loss cost


def gspo_loss_fn(fns: dict):
    """verl's GSPO loss when verl and its config import; else GSPO's formula through the TEPO core with the mask
    off and seq-mean-token-mean (identical to verl's in float32: tests/test_verl_integration.py)."""
    if not fns.get("replica"):
        try:
            from hydra import compose, initialize_config_module
            from verl.trainer.ppo.core_algos import get_policy_loss_fn
            from verl.utils.config import omega_conf_to_dataclass

            with initialize_config_module(config_module="verl.trainer.config", version_base=None):
                cfg = compose(config_name="ppo_trainer", overrides=[
                    "+algorithm=gspo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
            config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
            fn = get_policy_loss_fn("gspo")
            return "verl's gspo", lambda old, lp, adv, mask, old_entropy: fn(
                old, lp, adv, mask, "seq-mean-token-mean", config, None)[0]
        except Exception:  # noqa: BLE001 - fall through to the core's formula
            pass

    def seq_mean_token_mean(loss_mat, mask):
        mask = mask.to(loss_mat.dtype)
        return ((loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()

    options = TepoOptions(mask_rule="off")
    return "GSPO's formula (TEPO core, mask off, seq-mean-token-mean)", lambda old, lp, adv, mask, old_entropy: (
        tepo_policy_loss(lp, old, adv, mask, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, options=options,
                         aggregate=seq_mean_token_mean).loss)


def tepo_loss(old, lp, adv, mask, old_entropy):
    """The tepo preset: surprisal_old on the stored old entropy, KL penalty, token-mean."""
    return tepo_policy_loss(lp, old, adv, mask, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH,
                            options=TepoOptions(), old_entropy=old_entropy, aggregate=token_mean).loss


def check_loss_cost(fns: dict, size: dict, device: torch.device) -> dict:
    vocab, hidden = size.get("loss_vocab", VOCAB), size["loss_hidden"]
    length = 1024 if size["loss_tokens"] >= 4096 else 64
    batch = size["loss_tokens"] // length
    g = torch.Generator().manual_seed(2)
    hidden_states = torch.randn(batch * length, hidden, generator=g).to(device, torch.bfloat16)
    weight = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(device, torch.bfloat16)
    labels = torch.randint(0, vocab, (batch * length,), generator=g).to(device)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).to(device)  # (B, T)
    adv = (torch.randn(batch, 1, generator=g).to(device) * mask)  # (B, T)
    with torch.no_grad(), autocast(device):
        logits = F.linear(hidden_states, weight).view(batch, length, vocab)  # (B, T, V)
        old = fns["logprobs"](logits, labels.view(batch, length)).float()  # (B, T)
        old_entropy = fns["entropy"](logits).float()  # (B, T)
        del logits
    gspo_name, gspo = gspo_loss_fn(fns)
    losses = {"tepo": tepo_loss, "gspo": gspo}

    def step(name) -> tuple[float, float]:
        h = hidden_states.detach().clone().requires_grad_(True)
        w = weight.detach().clone().requires_grad_(True)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        began = time.perf_counter()
        with autocast(device):  # (B, T, V) logits, as verl's engine without remove-padding hands them over
            lp = fns["logprobs"](F.linear(h, w).view(batch, length, vocab), labels.view(batch, length))  # (B, T)
            loss = losses[name](old, lp, adv, mask, old_entropy)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - began
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if device.type == "cuda" else float("nan")
        return elapsed, peak

    def saved_bytes(name) -> int:
        """Bytes of the distinct storages autograd keeps for backward (device-independent)."""
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        h = hidden_states.detach().clone().requires_grad_(True)
        w = weight.detach().clone().requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(device):
            lp = fns["logprobs"](F.linear(h, w).view(batch, length, vocab), labels.view(batch, length))
            loss = losses[name](old, lp, adv, mask, old_entropy)
        loss.backward()
        return sum(storages.values())

    for name in losses:  # warm-up
        step(name)
    runs = {name: [] for name in losses}
    for repeat in range(size["repeats"]):
        for name in (losses if repeat % 2 == 0 else reversed(list(losses))):
            runs[name].append(step(name))
    out = {"gspo_loss": gspo_name, "tokens": batch * length, "valid_tokens": int(mask.sum()), "vocab": vocab,
           "hidden": hidden, "repeats": size["repeats"]}
    for name, values in runs.items():
        out[name] = {"median_s": statistics.median(v[0] for v in values), "peak_gib": max(v[1] for v in values),
                     "saved_gib": saved_bytes(name) / 2**30}
    out["time_ratio"] = out["tepo"]["median_s"] / out["gspo"]["median_s"]
    # the peak allocated memory on CUDA; on CPU (no allocator counter) the memory autograd saves for backward
    out["memory"] = "peak allocated" if device.type == "cuda" else "saved for backward"
    key = "peak_gib" if device.type == "cuda" else "saved_gib"
    out["memory_ratio"] = out["tepo"][key] / out["gspo"][key]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the default without CUDA)")
    parser.add_argument("--out", type=Path, help="a folder for gpu_check.json")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tiny = args.tiny or device.type != "cuda"
    size = TINY if tiny else FULL
    started = time.time()
    fns = verl_functions()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"gpu_check: {name}, torch {torch.__version__}, {'tiny' if tiny else 'full'} sizes; functions: "
          f"{fns['source']}; flash-attn cross-entropy {'imports' if fns['flash_ce'] else 'does not import'}")
    report = {"device": name, "torch": torch.__version__, "tiny": tiny, "functions": fns["source"]}

    report["dtype"] = check_dtypes(fns, device, size["vocab"], size["hidden"])
    for key, value in report["dtype"].items():
        print(f"dtype  {key}: {value}")

    noise = report["noise"] = check_noise(fns, size, device)
    print(f"noise  {noise['sequences']} sequences, {noise['tokens']} response tokens, packings {noise['packings']} "
          f"(random Qwen2, vocab {noise['model']['vocab']}, hidden {noise['model']['hidden']}, "
          f"{noise['model']['layers']} layers, bf16); the same packing twice bit-identical: "
          f"{noise['same_packing_bit_identical']}")
    for level in ("token_log_ratio", "sequence_log_ratio"):
        q = noise[level]
        print(f"noise  |{level.replace('_', ' ')}|: median {q['median']:.2e}, p90 {q['p90']:.2e}, p99 {q['p99']:.2e}, "
              f"max {q['max']:.2e}; share above the {CLIP_LOW:g} clip {q['share_above_clip']:.3f} (n={q['n']})")

    cost = report["loss_cost"] = check_loss_cost(fns, size, device)
    print(f"loss   {cost['tokens']} tokens ({cost['valid_tokens']} valid), lm-head {cost['vocab']} x {cost['hidden']}, "
          f"bf16 autocast, forward+backward, {cost['repeats']} interleaved repeats; GSPO = {cost['gspo_loss']}")
    for loss in ("tepo", "gspo"):
        print(f"loss   {loss}: median {cost[loss]['median_s'] * 1e3:.1f} ms, peak {cost[loss]['peak_gib']:.3f} GiB, "
              f"saved for backward {cost[loss]['saved_gib']:.3f} GiB")
    print(f"loss   memory ratio: {cost['memory']}")
    report["wall_s"] = time.time() - started
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(f"(total {report['wall_s']:.0f} s)")
    print(f"gpu tepo/gspo time={cost['time_ratio']:.3f} memory={cost['memory_ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
