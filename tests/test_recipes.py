"""Every GPU recipe x algorithm composes against the installed verl (DRY_RUN=1 -> `--cfg job`)."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_presets_and_checks import PRESETS

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
RECIPES = {  # recipe -> (default model, rollout TP, max response length)
    "qwen2.5-math-1.5b.sh": ("Qwen/Qwen2.5-Math-1.5B", 1, 3072),
    "qwen2.5-math-7b.sh": ("Qwen/Qwen2.5-Math-7B", 2, 3072),
    "qwen2.5-7b.sh": ("Qwen/Qwen2.5-7B", 2, 8192),
    "qwen3-4b-base.sh": ("Qwen/Qwen3-4B-Base", 1, 8192),
    "smoke-1gpu.sh": ("Qwen/Qwen2.5-0.5B-Instruct", 1, 1024),
}
ALGOS = ["tepo", "grpo", "dapo", "tepo_nomask"]


def run_recipe(recipe, tmp, *extra, **env):
    full_env = {**os.environ, "DRY_RUN": "1", "OUTPUT_DIR": str(tmp), "DATA_DIR": str(tmp / "data"), **env}
    return subprocess.run(["bash", str(RECIPES_DIR / recipe), *extra], capture_output=True, text=True,
                          env=full_env, timeout=600, cwd=tmp)


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recipes")
    jobs = [(recipe, algo) for recipe in RECIPES for algo in ALGOS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: run_recipe(job[0], tmp, ALGO=job[1]), jobs))
    out = {}
    for job, result in zip(jobs, results):
        assert result.returncode == 0, (job, result.stderr[-3000:])
        out[job] = OmegaConf.to_container(OmegaConf.create(result.stdout))
    return tmp, out


def flatten(tree, prefix=""):
    if isinstance(tree, dict):
        items = {}
        for key, value in tree.items():
            items.update(flatten(value, f"{prefix}{key}."))
        return items
    return {prefix[:-1]: tree}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("algo", ALGOS)
def test_recipe_composes_with_the_intended_keys(dry_runs, recipe, algo):
    tmp, configs = dry_runs
    cfg = OmegaConf.create(configs[(recipe, algo)])
    model, tp, response_length = RECIPES[recipe]
    for key, expected in PRESETS[algo].items():
        assert OmegaConf.select(cfg, key) == expected, key
    assert cfg.actor_rollout_ref.model.path == model
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == tp
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.data.max_response_length == response_length
    assert cfg.data.train_files == [str(tmp / "data" / "dapo_math_17k.parquet")]
    assert [Path(p).stem for p in cfg.data.val_files] == ["aime24", "aime25", "amc23", "math500", "minerva",
                                                          "olympiadbench"]
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n >= 2 and cfg.actor_rollout_ref.rollout.val_kwargs.do_sample
    assert cfg.reward.custom_reward_function.path.endswith("tepo_verl/reward/math_reward.py")
    assert cfg.reward.custom_reward_function.name == "compute_score"
    experiment = cfg.trainer.experiment_name
    assert experiment.startswith(f"{algo}-")
    assert cfg.trainer.validation_data_dir == str(tmp / experiment / "val_generations")
    assert list(cfg.trainer.logger) == ["console", "file"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_algorithms_differ_in_the_preset_alone(dry_runs, recipe):
    _, configs = dry_runs
    allowed = {key for preset in PRESETS.values() for key in preset}
    allowed |= {"trainer.experiment_name", "trainer.default_local_dir", "trainer.validation_data_dir"}
    base = flatten(configs[(recipe, "tepo")])
    for algo in ALGOS[1:]:
        other = flatten(configs[(recipe, algo)])
        differing = {k for k in base.keys() | other.keys() if base.get(k) != other.get(k)}
        unexplained = {k for k in differing if k not in allowed and not k.startswith(
            ("actor_rollout_ref.actor.policy_loss.", "actor_rollout_ref.actor.kl_loss", "actor_rollout_ref.actor.clip_ratio",
             "algorithm.filter_groups.", "actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.actor.calculate_entropy"))}
        assert not unexplained, (algo, unexplained)


def test_cluster_variables_and_passthrough(tmp_path):
    result = run_recipe("qwen2.5-math-7b.sh", tmp_path, "trainer.total_training_steps=3", "data.train_batch_size=64",
                        ALGO="dapo", NNODES="4", GPUS_PER_NODE="4", ROLLOUT_TP="4", OFFLOAD="1",
                        EXPERIMENT="mine", LOGGER="console,wandb", MODEL_PATH=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    cfg = OmegaConf.create(result.stdout)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (4, 4)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is True
    assert cfg.trainer.experiment_name == "mine" and list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.trainer.total_training_steps == 3 and cfg.data.train_batch_size == 64
    assert cfg.actor_rollout_ref.model.path == str(tmp_path)


@pytest.mark.parametrize("env,message", [
    ({"ALGO": "ppo"}, "unknown ALGO='ppo'; valid: tepo grpo dapo tepo_nomask"),
    ({"MODEL_PATH": ""}, "MODEL_PATH is empty"),
    ({"MODEL_PATH": "/nonexistent/model"}, "MODEL_PATH='/nonexistent/model' is not an existing folder"),
])
def test_bad_values_stop_with_a_clear_message(tmp_path, env, message):
    result = run_recipe("qwen2.5-math-1.5b.sh", tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr
