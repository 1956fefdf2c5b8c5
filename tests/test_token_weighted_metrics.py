"""The TEPO metrics that verl logs for a step are the step's values, however verl splits it.

Each mini-batch goes through verl's own code end to end: `left_right_2_no_padding`, `prepare_micro_batches`
(dynamic batch size, so the micro-batches differ in responses and tokens), the adapted `ppo_loss` per
micro-batch, the engine's `postprocess_batch_func` (which collects each metric with `append_to_dict`), the
worker's per-mini-batch reduction `Metric.aggregate_dp` over data-parallel ranks, its collection of the step's
mini-batches (`append_to_dict`) and the driver's `reduce_metrics`. The expected values come from the float64
reference run once over all the step's responses.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from batches import random_batch
from engine_batch import mini_batch, model_output
from tepo_reference import reference_tepo
from verl.utils import tensordict_utils as tu
from verl.utils.metric import Metric, reduce_metrics
from verl.utils.py_functional import append_to_dict
from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches
from verl.workers.utils import losses
from verl_config import actor_config

from tepo_verl.verl_adapter.ratio_metric import FirstMiniBatchMetric, RatioMetric

RATIOS = ("mask_frac", "mask_frac_positive", "masked_kl_mean", "penalty_grad_share", "masked_clipfrac",
          "seq_ratio_mean", "seq_clipfrac", "entropy", "entropy_delta", "surprisal_disagreement",
          "token_log_ratio_abs_mean")
EXTREMES = ("seq_ratio_min", "seq_ratio_max", "token_log_ratio_abs_max", "seq_log_ratio_abs_max")
ON_POLICY = ("token_log_ratio_abs_max", "seq_log_ratio_abs_max")
LENGTHS = [1, 12, 3, 12, 2, 9, 1, 11, 4, 12, 7, 1]  # responses of very different lengths
PROMPT_LENS = [2, 3, 1, 4, 2, 2, 3, 1, 2, 4, 1, 3]


def the_batch():
    batch = random_batch(seed=21, batch_size=len(LENGTHS), max_len=max(LENGTHS), drift=0.05, lengths=LENGTHS)
    batch.advantages[[1, 3, 9]] = -batch.advantages[[1, 3, 9]].abs()  # long responses without masked tokens
    return batch


def rank_data(batch, rows, *, dp_size, tokens, max_token_len):
    """One data-parallel rank's mini-batch `rows`, as the engine holds it (dynamic batch size)."""
    sub = type(batch)(**{k: getattr(batch, k)[rows] for k in vars(batch)})
    data = mini_batch(sub, [PROMPT_LENS[r] for r in rows], dp_size=dp_size, batch_num_tokens=tokens,
                      global_batch_size=len(LENGTHS))
    tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=max_token_len)
    return data


def rank_metrics(config, batch, rows, data, n_micro):
    """The rank's micro-batches (verl's split, `n_micro` of them as the ranks agree) through the loss, and the
    metrics the engine collects from them."""
    micro, indices = prepare_micro_batches(data, min_num_micro_batch=n_micro)
    outputs = []
    for mb, idx in zip(micro, indices, strict=True):
        rows_here = [rows[k] for k in idx]
        out = model_output(batch.log_prob[rows_here], batch.entropy[rows_here], mb)
        _, metrics = losses.ppo_loss(config, out, mb)
        outputs.append({"metrics": metrics})
    sizes = [(len(idx), sum(LENGTHS[rows[k]] for k in idx)) for idx in indices]  # (responses, tokens)
    return postprocess_batch_func(outputs, indices, data)["metrics"], sizes


def worker_reduction(per_rank: list[dict]) -> dict:
    """What TrainingWorker.train_mini_batch does with the ranks' gathered metrics (allgather_dict_into_dict)."""
    gathered = {key: [m[key] for m in per_rank] for key in per_rank[0]}
    return {key: Metric.aggregate_dp(val) if isinstance(val[0], Metric) else val for key, val in gathered.items()}


def step_values(per_mini_batch: list[dict]) -> dict:
    """What the worker does with its mini-batches' reduced metrics (append_to_dict, in train_mini_batch's loop) and
    what the driver then logs (reduce_metrics): the step's `tepo/` values."""
    collected: dict = {}
    for output in per_mini_batch:
        append_to_dict(collected, {k: v for k, v in output.items() if k.startswith("tepo/")})
    return reduce_metrics(collected)


def value(metric) -> float:
    return metric.aggregate() if isinstance(metric, Metric) else metric


def tepo_config():
    return actor_config(["+algorithm=tepo", "actor_rollout_ref.actor.clip_ratio_low=0.01",
                         "actor_rollout_ref.actor.clip_ratio_high=0.02"])


def reference_metrics(batch, config) -> dict:
    """The float64 reference's metrics over every response of `batch`, at `config`'s clip range and TEPO options."""
    _, expected = reference_tepo(batch.log_prob, batch.old_log_prob, batch.advantages, batch.response_mask,
                                 lo=config.clip_ratio_low, hi=config.clip_ratio_high, opts=config.policy_loss.tepo,
                                 entropy=batch.entropy, old_entropy=batch.old_entropy)
    return expected


@pytest.mark.parametrize("ranks", [[list(range(12))], [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]],
                         ids=["dp1", "dp2"])
def test_logged_metrics_are_the_whole_mini_batch_values(ranks):
    config = tepo_config()
    batch = the_batch()
    tokens = int(batch.response_mask.sum())
    datas = [rank_data(batch, rows, dp_size=len(ranks), tokens=tokens, max_token_len=20) for rows in ranks]
    n_micro = max(len(prepare_micro_batches(data)[0]) for data in datas)  # verl all-reduces the count (MAX)
    per_rank, sizes = [], []
    for rows, data in zip(ranks, datas, strict=True):
        metrics, s = rank_metrics(config, batch, rows, data, n_micro)
        per_rank.append(metrics)
        sizes.append(s)
    # micro-batches of different token counts on every rank, and of different response counts
    assert all(len({tok for _, tok in s}) > 1 for s in sizes) and len({n for s in sizes for n, _ in s}) > 1, sizes
    logged = worker_reduction(per_rank)

    expected = reference_metrics(batch, config)
    for name in RATIOS + EXTREMES:
        assert value(logged[f"tepo/{name}"]) == pytest.approx(expected[name], rel=1e-10, abs=1e-13), name
    for name in ("mask_frac", "masked_kl_mean", "mask_frac_positive", "seq_clipfrac"):
        assert 0 < expected[name]
    # The unweighted mean over micro-batches (verl's MEAN for a per-micro-batch ratio) would be off.
    naive = {}
    for name in ("mask_frac", "masked_kl_mean", "mask_frac_positive", "entropy"):
        values = [n / d if d else 0.0 for rank in per_rank for n, d in rank[f"tepo/{name}"].values]
        naive[name] = sum(values) / len(values)
        assert abs(naive[name] - expected[name]) > 1e-3 * abs(expected[name]), name
    # The driver logs the step: one mini-batch here, its value.
    assert step_values([logged])["tepo/mask_frac"] == pytest.approx(expected["mask_frac"], rel=1e-10)


def test_a_steps_logged_metrics_weigh_its_mini_batches_by_their_tokens():
    """Two mini-batches of one step, the second without a positive-advantage token (so without a masked one):
    the step's mask_frac_positive is the first mini-batch's, which the mean of the two mini-batches' values
    (verl's reduction of a float metric) would halve; every ratio is the float64 reference's over the step."""
    config = tepo_config()
    batch = the_batch()
    second = list(range(6, 12))
    batch.advantages[second] = -batch.advantages[second].abs()
    per_mini_batch = []
    for rows in (list(range(6)), second):
        tokens = int(batch.response_mask[rows].sum())
        data = rank_data(batch, rows, dp_size=1, tokens=tokens, max_token_len=20)
        metrics, _ = rank_metrics(config, batch, rows, data, len(prepare_micro_batches(data)[0]))
        per_mini_batch.append(worker_reduction([metrics]))
    assert value(per_mini_batch[1]["tepo/mask_frac_positive"]) == 0  # the empty ratio's value
    step = step_values(per_mini_batch)

    expected = reference_metrics(batch, config)
    first = value(per_mini_batch[0]["tepo/mask_frac_positive"])
    assert 0 < step["tepo/mask_frac_positive"] == pytest.approx(first, rel=1e-12)
    assert step["tepo/mask_frac_positive"] == pytest.approx(expected["mask_frac_positive"], rel=1e-10)
    for name in RATIOS + EXTREMES:
        assert step[f"tepo/{name}"] == pytest.approx(expected[name], rel=1e-10, abs=1e-13), name


def test_the_on_policy_metrics_are_the_first_mini_batchs_alone():
    """Three mini-batches of one step on two data-parallel ranks: the first on-policy (l = l_old up to a tiny
    noise), the later ones drifted, as after optimizer steps. `tepo/onpolicy_*` are the float64 reference's extremes
    over the first mini-batch's responses (both ranks), the plain extremes over the whole step's."""
    config = tepo_config()
    batch = the_batch()
    noise = 1e-7 * torch.randn(batch.log_prob.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    on_policy = list(range(4))
    with torch.no_grad():
        batch.log_prob[on_policy] = batch.old_log_prob[on_policy] + noise[on_policy]
    per_mini_batch = []
    for rows in (on_policy, [4, 5, 6, 7], [8, 9, 10, 11]):
        tokens = int(batch.response_mask[rows].sum())
        ranks = [rows[0::2], rows[1::2]]
        datas = [rank_data(batch, r, dp_size=2, tokens=tokens, max_token_len=20) for r in ranks]
        n_micro = max(len(prepare_micro_batches(data)[0]) for data in datas)
        per_rank = [rank_metrics(config, batch, r, data, n_micro)[0] for r, data in zip(ranks, datas, strict=True)]
        per_mini_batch.append(worker_reduction(per_rank))
    step = step_values(per_mini_batch)

    sub = type(batch)(**{k: getattr(batch, k)[on_policy] for k in vars(batch)})
    first, whole = reference_metrics(sub, config), reference_metrics(batch, config)
    for name in ON_POLICY:
        assert 0 < step[f"tepo/onpolicy_{name}"] == pytest.approx(first[name], rel=1e-10), name
        assert step[f"tepo/onpolicy_{name}"] < 1e-6 < step[f"tepo/{name}"] == pytest.approx(whole[name], rel=1e-10)


def test_first_mini_batch_metric_is_unknown_outside_verls_mini_batch_reduction():
    """Values that never went through aggregate_dp belong to no mini-batch: NaN (logged as unknown), never a max
    over the wrong updates; a sealed step survives pickling, as verl ships it from the worker to the driver."""
    loose = FirstMiniBatchMetric(value=0.5)
    loose.append(FirstMiniBatchMetric(value=0.7))
    assert loose.values == [0.5, 0.7] and loose.aggregate() != loose.aggregate()  # NaN
    step = FirstMiniBatchMetric().init_list()
    step.append(Metric.aggregate_dp([FirstMiniBatchMetric(value=2e-7), FirstMiniBatchMetric(value=3e-7)]))
    step.append(Metric.aggregate_dp([FirstMiniBatchMetric(value=0.4), FirstMiniBatchMetric(value=0.1)]))
    shipped = pickle.loads(pickle.dumps(step))
    assert shipped.mini_batches == [[2e-7, 3e-7], [0.4, 0.1]] and shipped.aggregate() == 3e-7
    with pytest.raises(ValueError, match="cannot merge"):
        step.append(Metric("max", 1.0))


def test_ratio_metric_merges_and_reduces_as_a_ratio_of_sums():
    a = RatioMetric(1.0, 4.0)
    collected = a.init_list()
    collected.append(a)
    collected.append(RatioMetric(0.0, 0.0))  # a micro-batch where the metric is undefined weighs nothing
    collected.append(RatioMetric(3.0, 4.0))
    assert collected.aggregate() == 0.5 and Metric.aggregate_dp([collected, RatioMetric(2.0, 2.0)]).aggregate() == 0.6
    shipped = pickle.loads(pickle.dumps(collected))  # as allgather_dict_into_dict ships it between ranks
    assert type(shipped) is RatioMetric and shipped.values == collected.values and shipped.aggregate() == 0.5
    assert RatioMetric(0.0, 0.0, empty=1.0).aggregate() == 1.0
    with pytest.raises(ValueError, match="cannot merge"):
        collected.append(Metric("sum", 1.0))
    # every other metric is still reduced by verl's own code
    ranks = [Metric("mean"), Metric("mean")]
    ranks[0].extend([1.0, 3.0])
    ranks[1].extend([3.0, 7.0])
    assert Metric.aggregate_dp(ranks) == 3.5
