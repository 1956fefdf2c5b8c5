"""The `dapo` preset's group filter finds its metric on every supported verl (0.9.0 and 0.9.1).

verl's v1 trainer builds its replay buffer from the composed config (`PPOTrainer._build_replay_buffer`), and the
buffer drops a finished group whose filter metric is the same for every response (`_dapo_filtered_keys`), or
stops the run when a response lacks the metric. Both run here as verl ships them, on the installed version. The
rewards are the project's own (the maths reward, which returns a dict, and the tiny task's, which returns a
float), scored by verl's reward-loop manager (`NaiveRewardManager.run_single`) and stored as verl's agent loop
stores a trajectory (`AgentLoopOutput.as_dict`, `list_of_dict_to_tensordict`). Only TransferQueue, a key-value
store in another process on a cluster, is stood in for in process.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.trainer.ppo.v1 import replay_buffer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl_config import compose_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_data  # noqa: E402

from tepo_lab.tiny import reward as tiny_reward  # noqa: E402
from tepo_verl.config import preset_names  # noqa: E402

pytestmark = pytest.mark.verl_090

MATHS_REWARD = {"path": "pkg://tepo_verl.reward.math_reward", "name": "compute_score"}
TINY_REWARD = {"path": tiny_reward.__file__, "name": "compute_score"}
TINY_TOKENIZER = Path(tiny_reward.__file__).parent / "policies" / "addition"

# Two groups of two responses each: one with a right and a wrong answer (kept), one with two wrong answers
# (all rewards equal: dropped).
MATHS_GROUPS = {"mixed": [("So \\boxed{7}.", "7"), ("\\boxed{8}", "7")],
                "equal": [("\\boxed{3}", "4"), ("no box", "4")]}
TINY_GROUPS = {"mixed": [("12", "12"), ("13", "12")], "equal": [("5", "6"), ("7", "6")]}


class TrajectoryStore:
    """In-process stand-in for TransferQueue: the trajectories as verl's agent loop puts them (each a dict of its
    fields, batched with verl's `list_of_dict_to_tensordict` on the way in and out), and their tags."""

    def __init__(self, trajectories: dict[str, dict], tags: dict[str, dict]):
        self.trajectories, self.tags = trajectories, tags

    def kv_list(self, partition_id=None):
        return {"train": dict(self.tags)}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return list_of_dict_to_tensordict([self.trajectories[key] for key in keys]).select(*select_fields)


def _scored_trajectory(manager, tokenizer, response: str, gold: str) -> dict:
    """One response scored by verl's reward manager, laid out as verl's agent loop stores it."""
    from verl import DataProto

    prompt_ids = tokenizer("1+1=", add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    sample = DataProto.from_dict(
        tensors={"prompts": torch.tensor([prompt_ids]), "responses": torch.tensor([response_ids]),
                 "attention_mask": torch.ones(1, len(prompt_ids) + len(response_ids), dtype=torch.int64)},
        non_tensors={"data_source": np.array(["maths"], dtype=object),
                     "reward_model": np.array([{"ground_truth": gold, "style": "rule"}], dtype=object),
                     "extra_info": np.array([{"index": 0}], dtype=object)})
    scored = manager.loop.run_until_complete(manager.run_single(sample))
    output = AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response_ids, response_mask=[1] * len(response_ids),
                             metrics=AgentLoopMetrics(), extra_fields={})
    output.reward_score = scored["reward_score"]  # as verl's AgentLoopWorker._compute_score assigns them
    output.extra_fields["reward_extra_info"] = scored["reward_extra_info"]
    return output.as_dict()


def _buffer_over(groups, reward_function, tokenizer, monkeypatch, overrides=(), preset="dapo"):
    """verl's replay buffer, built by verl's trainer from the composed preset, over the groups' scored responses."""
    config = OmegaConf.create({"reward": {"custom_reward_function": reward_function}})
    manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
    trajectories, tags = {}, {}
    for uid, responses in groups.items():
        tags[uid] = {"is_prompt": True, "status": "finished", "global_steps": 1}
        for session, (response, gold) in enumerate(responses):
            key = f"{uid}_{session}_0"  # verl's key: prompt uid, session, output index
            trajectories[key] = _scored_trajectory(manager, tokenizer, response, gold)
            tags[key] = {"status": "success", "global_steps": 1}
    store = TrajectoryStore(trajectories, tags)
    monkeypatch.setattr(replay_buffer, "tq", types.SimpleNamespace(kv_list=store.kv_list,
                                                                    kv_batch_get=store.kv_batch_get))
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = compose_config([f"+algorithm={preset}", *overrides])
    trainer.trainer_mode = trainer.config.trainer.v1.trainer_mode
    trainer._add_prompts_to_generate = lambda *args, **kwargs: None  # the refill: nothing to generate here
    buffer = trainer._build_replay_buffer()
    buffer._sync_metadata_from_transfer_queue()
    return buffer


@pytest.fixture(scope="module")
def maths_tokenizer():
    return conftest_data.qwen_tokenizer()


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_TOKENIZER))


@pytest.mark.parametrize("reward", ["maths", "tiny"])
def test_the_dapo_preset_drops_exactly_the_groups_whose_rewards_are_all_equal(reward, request, monkeypatch):
    groups, function = (MATHS_GROUPS, MATHS_REWARD) if reward == "maths" else (TINY_GROUPS, TINY_REWARD)
    buffer = _buffer_over(groups, function, request.getfixturevalue(f"{reward}_tokenizer"), monkeypatch)
    assert buffer.filter_groups_metric is not None, "the dapo preset does not turn the group filter on"
    dropped, by_value = buffer._dapo_filtered_keys("train")
    assert dropped == {"equal"}
    assert by_value == {0.0: 1}  # the dropped group's shared value: both answers wrong


@pytest.mark.parametrize("preset", [name for name in preset_names() if name != "dapo"])
def test_every_other_preset_filters_on_a_metric_the_rewards_write_once_enabled(preset, maths_tokenizer, monkeypatch):
    """e.g. kl_cov with its recipe's dynamic sampling: `algorithm.filter_groups.enable=true` is all it takes."""
    buffer = _buffer_over(MATHS_GROUPS, MATHS_REWARD, maths_tokenizer, monkeypatch,
                          ["algorithm.filter_groups.enable=true"], preset)
    dropped, by_value = buffer._dapo_filtered_keys("train")
    assert dropped == {"equal"}
    assert by_value == {0.0: 1}  # the dropped group's shared value: both answers wrong


def test_a_metric_the_rewards_do_not_write_stops_the_run(maths_tokenizer, monkeypatch):
    """What the filter does with a metric it cannot find (e.g. `reward` on verl 0.9.0): it stops, naming it."""
    buffer = _buffer_over(MATHS_GROUPS, MATHS_REWARD, maths_tokenizer, monkeypatch,
                          ["algorithm.filter_groups.metric=accuracy"])
    with pytest.raises(RuntimeError, match="missing DAPO metric 'accuracy'"):
        buffer._dapo_filtered_keys("train")
