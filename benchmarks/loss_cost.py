"""Loss cost: TEPO loss forward+backward vs verl's `vanilla` and `gspo` on the same random tensors.

Measured side by side in one run (interleaved repetitions, median time per loss), so the ratios are meaningful
on a noisy machine. Memory is the bytes autograd saves for backward (every tensor kept alive between forward and
backward, counted once per storage), which is device-independent; on CUDA the peak allocated memory is also
reported. The loss is elementwise over (B, T): at real scale its cost is small next to the model's, which
benchmarks/step_cost.py measures in verl's real trainer.

    python benchmarks/loss_cost.py --batch 64 --length 4096 --dtype float32 bfloat16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import verl  # noqa: F401  (loads the tepo-verl plugin)
from hydra import compose, initialize_config_module
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass

from tepo_verl.verl_adapter.actor_loss import _EXTRAS, TepoExtras


def actor_config(overrides):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer",
                      overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", *overrides])
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def make_inputs(batch, length, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = (-torch.rand(batch, length, generator=g) * 3).to(device, dtype)
    new = (old.float() + 0.01 * torch.randn(batch, length, generator=g).to(device)).to(dtype)
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).to(device)
    adv = (torch.randn(batch, 1, generator=g).to(device) * mask).to(dtype)
    entropy = (torch.rand(batch, length, generator=g) * 3).to(device, dtype)
    return old, new, adv, mask, entropy


def saved_bytes(fn):
    """Bytes of the distinct storages autograd saves for backward while fn() builds its graph."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return sum(storages.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    configs = {
        "vanilla": actor_config(["+algorithm=dapo"]),
        "gspo": actor_config(["+algorithm=gspo"]),
        "tepo": actor_config(["+algorithm=tepo"]),
    }
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, device {device}")
    print(f"shape: {args.batch} x {args.length}, repeats {args.repeats} (interleaved), median seconds")
    print("| dtype | loss | fwd+bwd ms | time / gspo | saved MiB | extra vs gspo in (B,T) fp32 tensors |"
          + (" peak MiB |" if device.type == "cuda" else ""))
    print("|---|---|---|---|---|---|" + ("---|" if device.type == "cuda" else ""))
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        old, new, adv, mask, entropy = make_inputs(args.batch, args.length, dtype, device)
        unit = args.batch * args.length * 4

        def run(mode, old=old, new=new, adv=adv, mask=mask, entropy=entropy):  # this dtype's inputs
            log_prob = new.detach().clone().requires_grad_(True)
            fn = get_policy_loss_fn(mode)
            # the preset: the stored entropy only
            token = _EXTRAS.set(TepoExtras(old_entropy=entropy)) if mode == "tepo" else None
            try:
                loss, _ = fn(old, log_prob, adv, mask, "token-mean", configs[mode], None)
            finally:
                if token is not None:
                    _EXTRAS.reset(token)
            return loss

        def timed(mode):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            run(mode).backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        for mode in configs:  # warm-up
            timed(mode)
        times = {mode: [] for mode in configs}
        for _ in range(args.repeats):
            for mode in configs:
                times[mode].append(timed(mode))
        medians = {mode: statistics.median(values) for mode, values in times.items()}
        memory = {mode: saved_bytes(lambda mode=mode: run(mode)) for mode in configs}
        peaks = {}
        if device.type == "cuda":
            for mode in configs:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                run(mode).backward()
                peaks[mode] = (torch.cuda.max_memory_allocated() - base) / 2**20
        for mode in configs:
            row = (f"| {dtype_name} | {mode} | {medians[mode] * 1e3:.1f} | {medians[mode] / medians['gspo']:.2f} | "
                   f"{memory[mode] / 2**20:.1f} | {(memory[mode] - memory['gspo']) / unit:+.2f} |")
            print(row + (f" {peaks[mode]:.1f} |" if peaks else ""))


if __name__ == "__main__":
    main()
