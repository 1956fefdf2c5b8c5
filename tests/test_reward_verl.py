"""The reward inside verl's own reward-loop manager (NaiveRewardManager.run_single), which calls the function
in a worker thread of its event loop's executor: the path where signal-based timeouts scored everything 0."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_data  # noqa: E402


def _one_sample(tokenizer, response: str, ground_truth: str, prompt_len: int = 6, response_len: int = 48):
    from verl import DataProto

    ids = tokenizer(response, add_special_tokens=False)["input_ids"][:response_len]
    pad = tokenizer.pad_token_id or 0
    responses = torch.tensor([ids + [pad] * (response_len - len(ids))])
    prompts = torch.full((1, prompt_len), pad)
    attention = torch.tensor([[1] * prompt_len + [1] * len(ids) + [0] * (response_len - len(ids))])
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention},
        non_tensors={
            "data_source": np.array(["aime24"], dtype=object),
            "reward_model": np.array([{"ground_truth": ground_truth, "style": "rule"}], dtype=object),
            "extra_info": np.array([{"index": 0}], dtype=object),
        },
    )


def test_naive_reward_manager_runs_it_in_a_thread():
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    tokenizer = conftest_data.qwen_tokenizer()
    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": "pkg://tepo_verl.reward.math_reward", "name": "compute_score"}}}
    )
    manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
    outputs = [
        manager.loop.run_until_complete(manager.run_single(_one_sample(tokenizer, response, gold)))
        for response, gold in [("So the answer is \\boxed{\\frac{1}{2}}.", "0.5"), ("\\boxed{7}", "8"), ("hmm", "8")]
    ]
    assert [o["reward_score"] for o in outputs] == [1.0, 0.0, 0.0]
    assert [o["reward_extra_info"]["pred"] for o in outputs] == ["\\frac{1}{2}", "7", ""]
    # verl builds one array per key from the first sample's keys: every sample must carry the same keys
    assert {tuple(sorted(o["reward_extra_info"])) for o in outputs} == {("acc", "pred", "score")}
