"""benchmarks/gpu_check.py at tiny size on CPU, and its replicas of verl's functions (what runs on a GPU machine
without verl) against verl's own."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import fresh_python
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_gpu_check_runs_at_tiny_size_on_cpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = fresh_python.run([str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--out", str(tmp_path)], env=env,
                            timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"gpu tepo/gspo time=(\d+\.\d{3}) memory=(\d+\.\d{3})", last)
    assert match, last
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["functions"].startswith("verl ")  # verl imports here: its own functions ran
    # CPU autocast keeps log_softmax in bf16 (the CPU fact the docs state); the fused torch backend upcasts
    # the log-probs and casts the entropy back to the logits' dtype (verl's source)
    assert report["dtype"]["logprobs_from_logits (log_softmax)"] == "torch.bfloat16"
    assert report["dtype"]["fused kernels, torch backend: log-probs"] == "torch.float32"
    assert report["dtype"]["fused kernels, torch backend: entropy"] == "torch.bfloat16"
    for level in ("token_log_ratio", "sequence_log_ratio"):
        q = report["noise"][level]
        assert 0 <= q["median"] <= q["p90"] <= q["p99"] <= q["max"] and 0 <= q["share_above_clip"] <= 1
    assert report["noise"]["same_packing_bit_identical"]  # the same packing twice: no noise at all
    assert report["loss_cost"]["gspo_loss"] == "verl's gspo"
    assert float(match[1]) == pytest.approx(report["loss_cost"]["time_ratio"], abs=5e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_replicas_compute_what_verls_functions_compute(dtype):
    """On a GPU machine without verl the script falls back to replicas; they must be verl 0.9.1's code paths."""
    verl = gpu_check.verl_functions()
    assert "replica" not in verl
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 16, generator=g).to(dtype)
    weight = torch.randn(50, 16, generator=g).to(dtype)
    labels = torch.randint(0, 50, (12,), generator=g)
    logits = hidden @ weight.t()
    with gpu_check.flash_ce(False), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(gpu_check._replica_logprobs(logits, labels), verl["logprobs"](logits, labels))
        assert torch.equal(gpu_check._replica_entropy(logits), verl["entropy"](logits))
        for ours, theirs in zip(gpu_check._replica_fused(hidden, weight, labels), verl["fused"](hidden, weight, labels),
                                strict=True):
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_the_gspo_fallback_equals_verls_gspo_in_float32():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 20, generator=g, dtype=torch.float64) * 3
    mask = torch.arange(20)[None] < torch.randint(5, 21, (6, 1), generator=g)
    adv = torch.randn(6, 1, generator=g, dtype=torch.float64) * mask
    results = []
    for fns in ({}, {"replica": True}):
        name, loss_fn = gpu_check.gspo_loss_fn(fns)
        log_prob = (old + 1e-3 * torch.randn(6, 20, generator=torch.Generator().manual_seed(4),
                                             dtype=torch.float64)).requires_grad_(True)
        loss = loss_fn(old, log_prob, adv, mask, None)
        loss.backward()
        results.append((name, loss.detach(), log_prob.grad))
    (verl_name, verl_loss, verl_grad), (core_name, core_loss, core_grad) = results
    assert verl_name == "verl's gspo" and core_name.startswith("GSPO's formula")
    torch.testing.assert_close(core_loss, verl_loss, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(core_grad, verl_grad, rtol=1e-9, atol=1e-12)


def test_gpu_check_runs_where_verl_does_not_import(tmp_path):
    """The lent GPU machine has torch and transformers but no verl: the replicas and GSPO's formula run instead."""
    code = ("import runpy, sys; sys.modules['verl'] = None; "
            f"sys.argv = ['gpu_check.py', '--tiny', '--out', {str(tmp_path)!r}]; "
            f"runpy.run_path({str(REPO / 'benchmarks' / 'gpu_check.py')!r}, run_name='__main__')")
    proc = fresh_python.run(["-c", code], timeout=600, env=dict(os.environ, PYTHONPATH=""), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(r"gpu tepo/gspo time=\d+\.\d{3} memory=\d+\.\d{3}", proc.stdout.strip().splitlines()[-1])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["functions"].startswith("replicas of verl 0.9.1")
    assert report["loss_cost"]["gspo_loss"].startswith("GSPO's formula")
    assert report["dtype"]["logprobs_from_logits (log_softmax)"] == "torch.bfloat16"  # CPU autocast, as verl's
