"""The metrics tepo-verl adds to verl's v1 trainer for every preset, in a run that asks for them
(TEPO_VERL_COMPARE_METRICS=1; tepo_verl/verl_adapter/run_metrics.py).

The trainer methods that run here are verl's own (`PPOTrainer._compute_old_log_prob`, `step`, `prepare_step`,
`_add_prompts_to_generate`, `_submit_batch_to_rollout`) on the real composed config of each preset, with verl's
padding and aggregation code. Only what lives in other processes on a cluster is stood in for, in process: the
TransferQueue key-value store (a dict of per-sample tensors, returned as jagged nested tensors as TransferQueue
returns them), the actor worker group (writes the engine's nested log-prob/entropy output over prompt + response
tokens), the agent-loop manager (records the prompts it is asked to generate) and the dataloader.
"""

from __future__ import annotations

import os
import types

import fresh_python
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.core_algos import agg_loss as core_agg_loss
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl_config import compose_config

from tepo_verl.import_hooks import restore, stock
from tepo_verl.verl_adapter import run_metrics

PRESETS = ["tepo", "tepo_nomask", "gspo", "grpo", "dapo", "gmpo", "kl_cov", "dr_grpo", "cispo", "sapo", "clip_cov"]


class KVStore:
    """In-process stand-in for TransferQueue's kv_batch_put / kv_batch_get (per-sample fields, jagged rows)."""

    def __init__(self):
        self.rows: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        self.tags: dict[tuple[str, str], dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            row = self.rows.setdefault((partition_id, key), {})
            if fields is not None:
                for name in fields.keys():
                    value = fields[name]
                    row[name] = value.unbind()[i] if value.is_nested else value[i]
            if tags is not None:
                self.tags.setdefault((partition_id, key), {}).update(tags[i])
        return KVBatchMeta(keys=list(keys), partition_id=partition_id,
                           tags=[self.tags.get((partition_id, key), {}) for key in keys])

    def kv_batch_get(self, keys, partition_id, select_fields):
        out = {name: torch.nested.as_nested_tensor([self.rows[(partition_id, k)][name] for k in keys],
                                                   layout=torch.jagged) for name in select_fields
               if all(name in self.rows[(partition_id, k)] for k in keys)}
        return TensorDict(out, batch_size=[len(keys)])


class ActorStandIn:
    """Writes what verl's actor writes in the old-log-prob pass: nested log-probs and entropies over prompt +
    response tokens, the response token t's value at position prompt_len + t - 1 (the engine's shift)."""

    def __init__(self, store, prompt_lens, entropies):
        self.store, self.prompt_lens, self.entropies = store, prompt_lens, entropies

    def compute_log_prob(self, batch):
        assert batch.extra_info["calculate_entropy"] is True
        for key, p, ent in zip(batch.keys, self.prompt_lens, self.entropies, strict=True):
            ent = torch.tensor(ent, dtype=torch.float32)
            layout = torch.cat([torch.full((p - 1,), 99.0), ent, torch.full((1,), 99.0)])
            self.store.rows[(batch.partition_id, key)].update(log_probs=-layout, entropy=layout)
        return batch


def trainer_for(preset, overrides=()):
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = compose_config([f"+algorithm={preset}", *overrides])
    return trainer


HOOKED = [(trainer_base, "agg_loss"), (trainer_base.PPOTrainer, "_compute_old_log_prob"),
          (trainer_base.PPOTrainer, "_submit_batch_to_rollout"), (trainer_base.PPOTrainer, "step")]


@pytest.fixture(scope="module", autouse=True)
def hooks_installed():
    """This process's run asks for the metrics: the hooks are on verl's v1 trainer for these tests, and off after."""
    run_metrics.patch_trainer_module(trainer_base)
    yield
    for owner, name in HOOKED:
        restore(owner, name)


_PROBE = (
    "import sys, verl\n"
    "assert 'verl.trainer.ppo.v1.trainer_base' not in sys.modules\n"
    "finders = [type(f).__name__ for f in sys.meta_path]\n"
    "from verl.trainer.ppo.v1 import trainer_base as tb\n"
    "from importlib.machinery import SourceFileLoader\n"
    "from verl.trainer.ppo.core_algos import agg_loss\n"
    "from tepo_verl.import_hooks import stock\n"
    "hooked = [tb.agg_loss is not agg_loss] + [stock(getattr(tb.PPOTrainer, name)) is not getattr(tb.PPOTrainer, name)"
    " for name in ('_compute_old_log_prob', 'step', '_submit_batch_to_rollout')]\n"
    "assert stock(tb.agg_loss) is agg_loss\n"
    "assert isinstance(tb.__loader__, SourceFileLoader) and tb.__spec__.loader is tb.__loader__\n"
    "print(hooked, '_PostImportFinder' in finders, '_PostImportFinder' in [type(f).__name__ for f in sys.meta_path])\n"
)


@pytest.mark.parametrize("flag,hooked", [("1", True), ("0", False), (None, False)])
def test_import_verl_hooks_the_v1_trainer_only_when_the_run_asks_and_when_it_is_imported(flag, hooked):
    env = {k: v for k, v in os.environ.items() if k != run_metrics.ENV_FLAG}
    env |= {run_metrics.ENV_FLAG: flag} if flag else {}
    result = fresh_python.run(["-c", _PROBE], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # hooked; the post-import finder waited for the trainer module, and left once it had run
    assert result.stdout.split("\n")[-2] == f"{[hooked] * 4} {hooked} False"


def test_a_bad_flag_value_is_one_line_naming_it_and_the_valid_ones():
    with pytest.raises(run_metrics.InvalidFlag, match=r"TEPO_VERL_COMPARE_METRICS='yes' is not valid; valid values: 1"):
        run_metrics.requested({run_metrics.ENV_FLAG: "yes"})
    assert run_metrics.requested({run_metrics.ENV_FLAG: "1"}) and not run_metrics.requested({})


def test_hooks_are_installed_once():
    before = [stock(getattr(owner, name)) for owner, name in HOOKED]
    run_metrics.patch_trainer_module(trainer_base)
    assert [stock(getattr(owner, name)) for owner, name in HOOKED] == before
    assert stock(trainer_base.agg_loss) is core_agg_loss


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"])
def test_patched_agg_loss_returns_verls_value(mode):
    g = torch.Generator().manual_seed(3)
    loss, mask = torch.rand(5, 7, generator=g), (torch.rand(5, 7, generator=g) > 0.3).float()
    assert torch.equal(trainer_base.agg_loss(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode),
                       core_agg_loss(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode))


# Rows of different lengths, so token-mean (every token weighs the same) and seq-mean-token-mean (every response
# weighs the same) differ: token-mean = 2.4 / 5 = 0.48; seq-mean-token-mean = (0.2 + 0.55 + 0.9) / 3 = 0.55;
# Dr. GRPO's seq-mean-token-sum-norm = (0.4 + 1.1 + 0.9) / 3 / loss_scale_factor = 0.8 / loss_scale_factor.
ENTROPIES = [[0.1, 0.3], [1.0, 0.1], [0.9]]
PROMPT_LENS = [3, 1, 4]
TOKEN_MEAN, SEQ_MEAN, SEQ_SUM = 0.48, 0.55, 0.8
#: Each preset's loss_agg_mode (the others are token-mean).
AGG_MODES = {"gspo": "seq-mean-token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("preset", PRESETS)
def test_entropy_token_mean_is_logged_for_every_preset(preset, monkeypatch):
    store = KVStore()
    monkeypatch.setattr(trainer_base, "tq", types.SimpleNamespace(kv_batch_get=store.kv_batch_get,
                                                                  kv_batch_put=store.kv_batch_put))
    keys = [f"uid{i}_0_0" for i in range(3)]
    for key, ent in zip(keys, ENTROPIES, strict=True):
        store.rows[("train", key)] = {"response_mask": torch.ones(len(ent), dtype=torch.int64),  # from the rollout
                                      "responses": torch.arange(len(ent)), "rollout_log_probs": -torch.tensor(ent)}
    trainer = trainer_for(preset)
    trainer.actor_rollout_wg = ActorStandIn(store, PROMPT_LENS, ENTROPIES)
    metrics = {}
    batch = trainer._compute_old_log_prob(KVBatchMeta(partition_id="train", keys=keys, tags=[{}] * 3), metrics)
    assert len(batch) == 3
    assert metrics[run_metrics.ENTROPY_TOKEN_MEAN] == pytest.approx(TOKEN_MEAN, rel=1e-6)
    actor = trainer.config.actor_rollout_ref.actor
    agg = actor.loss_agg_mode
    # verl's own actor/entropy follows the preset's loss_agg_mode, so it is not one quantity across presets.
    verl_entropy = (TOKEN_MEAN if agg == "token-mean" else SEQ_MEAN if agg == "seq-mean-token-mean"
                    else SEQ_SUM / actor.loss_scale_factor)  # seq-mean-token-sum-norm (Dr. GRPO)
    assert metrics["actor/entropy"] == pytest.approx(verl_entropy, rel=1e-6)
    assert agg == AGG_MODES.get(preset, "token-mean")
    # verl stored the old entropy per response token for the loss, unchanged by the hook
    assert torch.allclose(store.rows[("train", keys[0])]["entropy"], torch.tensor([0.1, 0.3]))


def test_entropy_is_not_logged_when_verl_computes_none(monkeypatch):
    store = KVStore()
    monkeypatch.setattr(trainer_base, "tq", types.SimpleNamespace(kv_batch_get=store.kv_batch_get,
                                                                  kv_batch_put=store.kv_batch_put))
    store.rows[("train", "k")] = {"rollout_log_probs": torch.zeros(2)}
    trainer = trainer_for("grpo", ["algorithm.rollout_correction.bypass_mode=true"])
    metrics = {}
    trainer._compute_old_log_prob(KVBatchMeta(partition_id="train", keys=["k"], tags=[{}]), metrics)
    assert metrics == {}


class AgentLoopStandIn:
    def __init__(self):
        self.prompts = 0

    def generate_sequences(self, batch):
        self.prompts += len(batch)


def one_prompt_batches():
    for i in range(10_000):
        yield {"raw_prompt": np.array([f"q{i}"], dtype=object), "index": torch.tensor([i])}


@pytest.mark.parametrize("preset,refills,expected_prompts", [("grpo", [], 4), ("tepo", [], 4),
                                                           ("dapo", [2, 3], 9)])
def test_generated_prompts_and_responses_per_step(preset, refills, expected_prompts, monkeypatch):
    """verl's real step(): prepare_step submits the batch, DAPO's refills go through verl's refill function
    (_add_prompts_to_generate, as the replay buffer calls it); each step logs its own count."""
    store = KVStore()
    monkeypatch.setattr(trainer_base, "tq", types.SimpleNamespace(kv_batch_get=store.kv_batch_get,
                                                                  kv_batch_put=store.kv_batch_put))
    trainer = trainer_for(preset, ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=3",
                                   "data.gen_batch_size=1"])  # verl's _init_dataloader sets 1 for DAPO
    trainer.trainer_mode, trainer.parameter_sync_step, trainer.global_steps = "sync", 1, 1
    trainer.train_dataloader, trainer.train_dataloader_it = one_prompt_batches(), None
    trainer.agent_loop_manager = AgentLoopStandIn()

    def step_once(metrics, timing_raw, sample_batch_size):  # stands in for sampling and the PPO update
        for k in refills:
            trainer._add_prompts_to_generate(k)
        metrics["training/filter_groups/evicted_samples"] = sum(refills)
        return KVBatchMeta(partition_id="train", keys=[f"s{i}" for i in range(4)], tags=[{}] * 4)

    trainer._step_once = step_once
    for _ in range(2):
        metrics = {}
        trainer.step(metrics, {})
        assert metrics[run_metrics.PROMPTS_GENERATED] == expected_prompts
        assert metrics[run_metrics.RESPONSES_GENERATED] == 3 * expected_prompts
    assert trainer.agent_loop_manager.prompts == 2 * expected_prompts
