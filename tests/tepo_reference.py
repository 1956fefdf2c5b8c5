"""A slow, loop-based TEPO reference written directly from the formulas of docs/algorithm.md.

Independent of tepo_verl.core: no vectorisation, one token at a time, Python `math` for every non-differentiable
decision. Used by the golden tests in float64.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch


def _kl(l: torch.Tensor, target: float, estimator: str) -> torch.Tensor:
    d = l - target
    if estimator in ("k1", "kl"):
        return d
    if estimator == "abs":
        return d.abs()
    if estimator in ("k2", "mse"):
        return 0.5 * d * d
    # k3 / low_var_kl: r = log(pi_target / pi); exp(r) - r - 1, with verl's clamps
    r = torch.clamp(-d, -20.0, 20.0)
    return torch.clamp(torch.exp(r) - r - 1.0, -10.0, 10.0)


def _kl_slope(l: float, target: float, estimator: str) -> float:
    """dD/dl of the estimator at l, in closed form (0 where verl's clamps saturate, as their gradient is)."""
    d = l - target
    if estimator in ("k1", "kl"):
        return 1.0
    if estimator == "abs":
        return float((d > 0) - (d < 0))
    if estimator in ("k2", "mse"):
        return d
    r = -d
    if not -20.0 <= r <= 20.0:
        return 0.0
    return 1.0 - math.exp(r) if -10.0 <= math.exp(r) - r - 1.0 <= 10.0 else 0.0


def _policy_slope(a: float, s: float, s_clip: float, log_s: float, clamp: float, w: float) -> float:
    """d pg / d l of pg = max(-A s, -A clip(s)) * w with s = exp(min(log s, clamp)) and d s / d l = s: -A s w on
    the unclipped branch, 0 on the clipped branch or above the clamp."""
    if log_s > clamp:
        return 0.0
    return -a * s * w if -a * s >= -a * s_clip else 0.0


def _falling(rule, l, l_old, h, h_old, rtol=0.0) -> bool:
    if rule == "old":
        return h < (1 - rtol) * h_old
    if rule == "surprisal":
        return l + h > 0
    if rule == "surprisal_old":
        return l_old + h_old > 0
    return rule == "always"


def _mask(rule, opts, valid, log_prob, old_log_prob, advantages, entropy, old_entropy):
    """{(i, t): M_it}: the rule's test and the advantage factor, then (mask_top_frac) the ceil(f * n) candidates
    with the largest p (l + H) A, ties to the earlier (i, t)."""
    B, T = len(valid), len(valid[0]) if valid else 0
    mask, score = {}, {}
    for i in range(B):
        for t in range(T):
            if not valid[i][t]:
                continue
            l, l_old, a = float(log_prob[i, t]), float(old_log_prob[i, t]), float(advantages[i, t])
            h = None if entropy is None else float(entropy[i, t])
            h_old = None if old_entropy is None else float(old_entropy[i, t])
            mask[(i, t)] = (a > 0 or opts.mask_advantage == "any") and _falling(rule, l, l_old, h, h_old,
                                                                                    opts.mask_old_rtol)
            if mask[(i, t)] and opts.mask_top_frac < 1:
                p_l, p_h = (l_old, h_old) if rule == "surprisal_old" else (l, h)
                score[(i, t)] = math.exp(p_l) * (p_l + p_h) * a
    if opts.mask_top_frac < 1 and rule != "off":
        k = math.ceil(Fraction(str(opts.mask_top_frac)) * len(score))
        ranked = sorted(score, key=lambda it: -score[it])  # stable: ties keep (i, t) order
        keep = set(ranked[:k])
        mask = {it: m and it in keep for it, m in mask.items()}
    return mask


def reference_tepo(
    log_prob, old_log_prob, advantages, response_mask, *, lo, hi, opts, rule=None,
    entropy=None, old_entropy=None, ref_log_prob=None, is_weights=None, agg="token-mean", n_seqs=None,
):
    """Returns (loss, metrics). `rule` = the mask rule that should run. `n_seqs`: the seq-mean denominator
    (verl's global_batch_size; default: the number of non-empty responses, as verl's agg_loss without it)."""
    rule = rule or opts.mask_rule
    B, T = log_prob.shape
    lp = log_prob.detach()  # for the non-differentiable decisions
    valid = [[bool(response_mask[i, t]) for t in range(T)] for i in range(B)]
    token_losses = {}
    n_valid = sum(sum(row) for row in valid)
    masked = kl_sum = 0.0
    n_positive = masked_positive = 0
    penalty_slope_sum = policy_slope_sum = 0.0
    clipped_tokens = clipped_lower = 0
    seq_ratios, seq_clipped, seq_abs_log_ratios = [], [], []
    masked_clipped = 0
    ppo_kl = ent_sum = dent_sum = 0.0
    abs_log_ratios = []
    disagree = 0
    masks = _mask(rule, opts, valid, lp, old_log_prob, advantages, entropy, old_entropy)
    for i in range(B):
        ts = [t for t in range(T) if valid[i][t]]
        if not ts:
            continue
        seq_lr = sum(float(lp[i, t]) - float(old_log_prob[i, t]) for t in ts) / len(ts)
        seq_ratios.append(math.exp(min(seq_lr, opts.log_ratio_clamp)))
        seq_abs_log_ratios.append(abs(seq_lr))
        any_clipped = False
        running = 0.0
        for k, t in enumerate(ts):
            l = log_prob[i, t]
            lf, lo_f = float(lp[i, t]), float(old_log_prob[i, t])
            running += lf - lo_f
            base = seq_lr if opts.ratio_mode == "sequence" else running / (k + 1)
            log_s = torch.clamp(base + l - l.detach(), max=opts.log_ratio_clamp)
            s = torch.exp(log_s)
            a = float(advantages[i, t])
            s_clip = torch.clamp(s, 1 - lo, 1 + hi)
            pg = torch.maximum(-a * s, -a * s_clip)
            if is_weights is not None:
                pg = pg * float(is_weights[i, t])
            is_clipped = (-a * float(s_clip.detach())) > (-a * float(s.detach()))
            any_clipped |= is_clipped
            clipped_tokens += is_clipped
            clipped_lower += is_clipped and a < 0
            h = None if entropy is None else float(entropy[i, t])
            h_old = None if old_entropy is None else float(old_entropy[i, t])
            m = masks[(i, t)]
            target = lo_f if opts.kl_target == "old" else (None if ref_log_prob is None else float(ref_log_prob[i, t]))
            if opts.mask_rule == "off" or target is None:
                d = torch.zeros((), dtype=l.dtype)
            else:
                d = _kl(l, target, opts.kl_estimator)
            if m:
                w = 1.0 if is_weights is None else float(is_weights[i, t])
                policy_slope_sum += abs(_policy_slope(a, float(s.detach()), float(s_clip.detach()), base,
                                                      opts.log_ratio_clamp, w))
                if opts.mask_action == "penalty" and opts.mask_rule != "off" and target is not None:
                    penalty_slope_sum += abs(opts.kl_coef * _kl_slope(lf, target, opts.kl_estimator))
            n_positive += a > 0
            masked_positive += m and a > 0
            if opts.mask_action == "penalty":
                loss_it = pg + (opts.kl_coef * d if m else 0.0)
            else:
                loss_it = pg * 0.0 if m else pg
            token_losses[(i, t)] = loss_it
            masked += m
            masked_clipped += m and is_clipped
            kl_sum += float(d.detach()) if m else 0.0
            ppo_kl += lo_f - lf
            abs_log_ratios.append(abs(lf - lo_f))
            if h is not None:
                ent_sum += h
                if h_old is not None:
                    dent_sum += h - h_old
                    disagree += (a > 0 and lf + h > 0) != (a > 0 and lo_f + h_old > 0)
        seq_clipped.append(any_clipped)

    if agg == "token-mean":
        loss = sum(token_losses.values()) / max(n_valid, 1)
    elif agg == "seq-mean-token-mean":
        per_seq = []
        for i in range(B):
            items = [v for (r, _), v in token_losses.items() if r == i]
            if items:
                per_seq.append(sum(items) / len(items))
        loss = sum(per_seq) / (n_seqs or max(len(per_seq), 1))
    else:
        raise ValueError(agg)
    if not torch.is_tensor(loss):
        loss = torch.zeros((), dtype=log_prob.dtype) + loss

    metrics = {
        "mask_frac": masked / n_valid if n_valid else 0.0,
        "mask_frac_positive": masked_positive / n_positive if n_positive else 0.0,
        "masked_kl_mean": kl_sum / masked if masked else 0.0,
        "penalty_grad_share": (penalty_slope_sum / (penalty_slope_sum + policy_slope_sum)
                               if penalty_slope_sum + policy_slope_sum else 0.0),
        "masked_clipfrac": masked_clipped / masked if masked else 0.0,
        "seq_ratio_mean": sum(seq_ratios) / len(seq_ratios) if seq_ratios else 1.0,
        "seq_ratio_min": min(seq_ratios) if seq_ratios else 1.0,
        "seq_ratio_max": max(seq_ratios) if seq_ratios else 1.0,
        "seq_clipfrac": sum(seq_clipped) / len(seq_clipped) if seq_clipped else 0.0,
        "token_clipfrac": clipped_tokens / n_valid if n_valid else 0.0,
        "token_clipfrac_lower": clipped_lower / n_valid if n_valid else 0.0,
        "ppo_kl": ppo_kl / n_valid if n_valid else 0.0,
        "token_log_ratio_abs_mean": sum(abs_log_ratios) / n_valid if n_valid else 0.0,
        "token_log_ratio_abs_max": max(abs_log_ratios, default=0.0),
        "seq_log_ratio_abs_max": max(seq_abs_log_ratios, default=0.0),
    }
    if entropy is not None:
        metrics["entropy"] = ent_sum / n_valid if n_valid else 0.0
        if old_entropy is not None:
            metrics["entropy_delta"] = dent_sum / n_valid if n_valid else 0.0
            metrics["surprisal_disagreement"] = disagree / n_valid if n_valid else 0.0
    return loss, metrics


def reference_advantage(scores, index, norm_by_std=True, eps=1e-6):
    """A_i per response, from the spec formula, with plain Python statistics."""
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(float(scores[i]))
    out = []
    for i, g in enumerate(index):
        values = groups[g]
        if len(values) < 2 or max(values) == min(values):
            out.append(0.0)
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        out.append((float(scores[i]) - mean) / (std + eps) if norm_by_std else float(scores[i]) - mean)
    return out
