"""Every GPU recipe x algorithm composes against the installed verl and passes verl's own config validation; the
composed configs show each choice docs/recipes.md reasons out.

The recipes run for real (bash) with DRY_RUN=args, which prints the arguments they would give verl, and those are
composed in this process into verl's config (verl_config.command_line_config). That this is what verl's own
`--cfg job` makes of them is checked once, on a paper recipe's DRY_RUN=1 (test_paper_recipe_printout)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest_data import MATH_EVAL_ROWS
from omegaconf import OmegaConf
from test_presets_and_checks import PRESETS
from verl_config import command_line_config

REPO = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO / "recipes"
#: recipe -> (default model, rollout TP, max prompt length, max response length)
RECIPES = {
    "qwen2.5-math-1.5b.sh": ("Qwen/Qwen2.5-Math-1.5B", 1, 1024, 3072),
    "qwen2.5-math-7b.sh": ("Qwen/Qwen2.5-Math-7B", 1, 1024, 3072),
    "qwen2.5-7b.sh": ("Qwen/Qwen2.5-7B", 2, 2048, 8192),
    "qwen3-14b.sh": ("Qwen/Qwen3-14B", 4, 2048, 8192),
    "qwen3-4b-base.sh": ("Qwen/Qwen3-4B-Base", 1, 2048, 8192),
    "smoke-1gpu.sh": ("Qwen/Qwen2.5-0.5B-Instruct", 1, 512, 1024),
}
#: The context each model has (max_position_embeddings of its Hugging Face config), which a recipe must fit.
MODEL_CONTEXT = {
    "Qwen/Qwen2.5-Math-1.5B": 4096,
    "Qwen/Qwen2.5-Math-7B": 4096,
    "Qwen/Qwen2.5-7B": 32768,
    "Qwen/Qwen3-14B": 40960,
    "Qwen/Qwen3-4B-Base": 32768,
    "Qwen/Qwen2.5-0.5B-Instruct": 32768,
}
ALGOS = ["tepo", "tepo_nomask", "gspo", "grpo", "dapo"]
PAPER_RECIPES = ["qwen2.5-7b.sh", "qwen3-14b.sh"]


def run_recipe(recipe, tmp, *extra, dry_run="args", **env):
    """`bash recipes/RECIPE EXTRA...` with DRY_RUN=dry_run (args: print verl's arguments; 1: verl's `--cfg job`)."""
    full_env = {**os.environ, "DRY_RUN": dry_run, "OUTPUT_DIR": str(tmp), "DATA_DIR": str(tmp / "data"), **env}
    return subprocess.run(["bash", str(RECIPES_DIR / recipe), *extra], capture_output=True, text=True,
                          env=full_env, timeout=600, cwd=tmp)


def verl_args(result) -> list[str]:
    """The arguments a DRY_RUN=args recipe would give verl (one a line on its stdout)."""
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def dry_config(recipe, tmp, *extra, **env):
    """verl's config for what the recipe would run."""
    return command_line_config(verl_args(run_recipe(recipe, tmp, *extra, **env)))


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recipes")
    jobs = [(recipe, algo) for recipe in RECIPES for algo in ALGOS]
    with ThreadPoolExecutor(max_workers=3) as pool:  # bash alone: the composition below is in this process
        results = list(pool.map(lambda job: run_recipe(job[0], tmp, ALGO=job[1]), jobs))
    out = {}
    for job, result in zip(jobs, results):
        out[job] = OmegaConf.to_container(command_line_config(verl_args(result)))
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
    model, tp, prompt_length, response_length = RECIPES[recipe]
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    for key, expected in PRESETS[algo].items():
        assert OmegaConf.select(cfg, key) == expected, key
    assert cfg.actor_rollout_ref.model.path == model
    assert actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert rollout.name == "vllm" and rollout.tensor_model_parallel_size == tp and rollout.n == 8
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (prompt_length, response_length)
    assert cfg.data.train_files == [str(tmp / "data" / "dapo_math_17k.parquet")]
    assert [Path(p).stem for p in cfg.data.val_files] == ["aime24", "aime25", "amc23", "math500", "minerva",
                                                          "olympiadbench"]
    assert rollout.val_kwargs.do_sample and rollout.val_kwargs.temperature == 0.6
    assert cfg.reward.custom_reward_function.path.endswith("tepo_verl/reward/math_reward.py")
    assert cfg.reward.custom_reward_function.name == "compute_score"
    experiment = cfg.trainer.experiment_name
    assert experiment.startswith(f"{algo}-")
    assert cfg.trainer.validation_data_dir == str(tmp / experiment / "val_generations")
    assert list(cfg.trainer.logger) == ["console", "file"]
    # compare's columns, asked for in every Ray process (docs/compare.md), even on a cluster started beforehand
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.TEPO_VERL_COMPARE_METRICS == "1"
    # the keys the engine reads: gradient clipping, checkpoint retention, entropy checkpointing, chunked prefill
    assert actor.optim.clip_grad == 1.0
    assert cfg.trainer.max_actor_ckpt_to_keep == 2
    assert actor.entropy_checkpointing is True
    assert rollout.enable_chunked_prefill is True
    assert rollout.max_num_batched_tokens >= prompt_length + response_length


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("algo", ALGOS)
def test_verl_validates_and_builds_the_engine_configs(dry_runs, recipe, algo):
    """verl's driver-side validate_config passes, and the dataclasses the workers build run FSDP2 with our clip."""
    import verl  # noqa: F401  (the plugin: TEPO's policy-loss config class)
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    _, configs = dry_runs
    cfg = OmegaConf.create(configs[(recipe, algo)])
    validate_config(cfg, use_reference_policy=bool(cfg.actor_rollout_ref.actor.use_kl_loss), use_critic=False)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.engine.strategy == "fsdp2" and actor.optim.clip_grad == 1.0
    assert actor.engine.entropy_checkpointing is True
    ref = OmegaConf.to_container(cfg.actor_rollout_ref.ref, resolve=True)
    for key in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                "log_prob_max_token_len_per_gpu"):  # popped by verl's engine_workers before building it
        ref.pop(key)
    ref.update(ppo_mini_batch_size=actor.ppo_mini_batch_size, use_dynamic_bsz=True)
    assert omega_conf_to_dataclass(OmegaConf.create(ref)).engine.strategy == "fsdp2"
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.max_model_len == cfg.data.max_prompt_length + cfg.data.max_response_length


@pytest.mark.parametrize("recipe", RECIPES)
def test_algorithms_differ_in_the_preset_alone(dry_runs, recipe):
    _, configs = dry_runs
    allowed = {key for preset in PRESETS.values() for key in preset}
    allowed |= {"trainer.experiment_name", "trainer.default_local_dir", "trainer.validation_data_dir",
                "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"}  # the run's folder
    base = flatten(configs[(recipe, "tepo")])
    for algo in ALGOS[1:]:
        other = flatten(configs[(recipe, algo)])
        differing = {k for k in base.keys() | other.keys() if base.get(k) != other.get(k)}
        unexplained = {k for k in differing if k not in allowed and not k.startswith(
            ("actor_rollout_ref.actor.policy_loss.", "actor_rollout_ref.actor.kl_loss",
             "actor_rollout_ref.actor.clip_ratio", "algorithm.filter_groups.", "actor_rollout_ref.actor.entropy_coeff",
             "actor_rollout_ref.actor.calculate_entropy"))}
        assert not unexplained, (algo, unexplained)


@pytest.mark.parametrize("recipe", RECIPES)
def test_token_budgets(dry_runs, recipe):
    """Dynamic batch size: training holds at least two full-length sequences per GPU, the forward-only log-prob
    passes (old policy, reference) 1.5x the training budget, the same for both."""
    _, configs = dry_runs
    cfg = OmegaConf.create(configs[(recipe, "grpo")])
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    train = cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz
    assert train >= 2 * seq and train % seq == 0
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == train * 3 // 2
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == train * 3 // 2


@pytest.mark.parametrize("recipe", RECIPES)
def test_model_context_is_respected(dry_runs, recipe):
    _, configs = dry_runs
    cfg = OmegaConf.create(configs[(recipe, "tepo")])
    context = MODEL_CONTEXT[RECIPES[recipe][0]]
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    assert cfg.actor_rollout_ref.rollout.max_model_len == seq <= context


@pytest.mark.parametrize("recipe", RECIPES)
def test_validation_during_training_is_cheap(dry_runs, recipe):
    """1-2 samples per problem, at most every 20 steps, and at most 20% of the training generations in all."""
    _, configs = dry_runs
    cfg = OmegaConf.create(configs[(recipe, "tepo")])
    val_n, freq = cfg.actor_rollout_ref.rollout.val_kwargs.n, cfg.trainer.test_freq
    assert val_n in (1, 2) and 1 <= freq <= 20 and cfg.trainer.val_before_train
    steps = cfg.trainer.total_training_steps
    suite = sum(MATH_EVAL_ROWS[Path(path).stem] for path in cfg.data.val_files)  # the recipe's validation files
    problems = suite if cfg.data.val_max_samples < 0 else min(cfg.data.val_max_samples, suite)
    validation = problems * val_n * (steps // freq + 1)
    training = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n * steps
    assert validation <= 0.2 * training, (recipe, validation, training)


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_paper_setup(dry_runs, recipe):
    """64 prompts x 8 samples per step, mini-batches of 8 prompts (8 updates per step), responses up to 8192 tokens,
    on one node of 8 GPUs."""
    _, configs = dry_runs
    cfg = OmegaConf.create(configs[(recipe, "tepo")])
    assert cfg.data.train_batch_size == 64 and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8 and cfg.actor_rollout_ref.actor.ppo_epochs == 1
    assert cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    assert cfg.data.max_response_length == 8192
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 8)
    assert cfg.data.train_files[0].endswith("dapo_math_17k.parquet")


def test_paper_recipe_printout(dry_runs):
    """The dry run docs/recipes.md shows (DRY_RUN=1: verl's own `--cfg job`, the one verl start of this file) prints
    the paper's numbers as written (test_paper_setup checks them on both paper recipes), and its config is what the
    other tests compose from the recipe's DRY_RUN=args: the same arguments, composed the same way."""
    recipe = "qwen3-14b.sh"
    result = run_recipe(recipe, dry_runs[0], ALGO="tepo", dry_run="1")
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ("train_batch_size: 64", "'n': 8", "ppo_mini_batch_size: 8", "max_response_length: 8192"):
        assert re.search(rf"^\s*{re.escape(line)}$", result.stdout, re.M), (recipe, line)
    assert OmegaConf.to_container(OmegaConf.create(result.stdout)) == dry_runs[1][(recipe, "tepo")]


def test_no_keys_the_engine_ignores():
    """verl 0.9.1's engine reads optim.clip_grad (not actor.grad_clip), always CPU-offloads the reference model (its
    fsdp_config.param_offload does nothing) and only has async rollouts (rollout.mode is deprecated)."""
    for path in [RECIPES_DIR / "common.sh", *(RECIPES_DIR / r for r in RECIPES)]:
        text = path.read_text()
        for dead in ("actor.grad_clip", "ref.fsdp_config.param_offload", "rollout.mode", "actor.strategy=fsdp\""):
            assert dead not in text, (path.name, dead)


def test_cluster_variables_and_passthrough(tmp_path):
    cfg = dry_config("qwen2.5-math-7b.sh", tmp_path, "trainer.total_training_steps=3", "data.train_batch_size=64",
                     ALGO="dapo", NNODES="4", GPUS_PER_NODE="4", ROLLOUT_TP="4", OFFLOAD="1", SP="2",
                     EXPERIMENT="mine", LOGGER="console,wandb", MODEL_PATH=str(tmp_path), MODEL_CONTEXT="4096",
                     MAX_CKPT_TO_KEEP="5", SAVE_FREQ="25", TEST_FREQ="5", VAL_N="2", VAL_MAX_SAMPLES="300")
    actor = cfg.actor_rollout_ref.actor
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (4, 4)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert actor.fsdp_config.param_offload is True and actor.fsdp_config.optimizer_offload is True
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is False  # verl's default: the recipe leaves it
    assert actor.ulysses_sequence_parallel_size == 2
    assert OmegaConf.select(cfg, "actor_rollout_ref.ref.ulysses_sequence_parallel_size") == 2
    assert cfg.trainer.experiment_name == "mine" and list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.trainer.total_training_steps == 3 and cfg.data.train_batch_size == 64
    assert cfg.actor_rollout_ref.model.path == str(tmp_path)
    assert (cfg.trainer.max_actor_ckpt_to_keep, cfg.trainer.save_freq, cfg.trainer.test_freq) == (5, 25, 5)
    assert (cfg.actor_rollout_ref.rollout.val_kwargs.n, cfg.data.val_max_samples) == (2, 300)


def test_shorter_lengths_scale_the_budgets(tmp_path):
    cfg = dry_config("qwen2.5-math-1.5b.sh", tmp_path, "data.max_response_length=2048", MAX_PROMPT_LENGTH="512")
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (512, 2048)
    assert cfg.actor_rollout_ref.rollout.max_model_len == 2560
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 4 * 2560
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 6 * 2560


@pytest.mark.parametrize("args,env,message", [
    (["data.max_response_length=4000"], {},
     "prompt + response = 1024 + 4000 = 5024 tokens exceeds the model's context of 4096 tokens"),
    ([], {"MAX_PROMPT_LENGTH": "2048"},
     "prompt + response = 2048 + 3072 = 5120 tokens exceeds the model's context of 4096 tokens"),
    (["data.max_prompt_length=100", "++data.max_prompt_length=1500"], {},
     "prompt + response = 1500 + 3072 = 4572 tokens exceeds the model's context of 4096 tokens"),
    ([], {"MODEL_CONTEXT": "3000"},
     "prompt + response = 1024 + 3072 = 4096 tokens exceeds the model's context of 3000 tokens (MODEL_CONTEXT)"),
    (["actor_rollout_ref.rollout.max_model_len=3000"], {},
     "actor_rollout_ref.rollout.max_model_len=3000 must lie between prompt + response (4096) and the model's "
     "context (4096)"),
])
def test_context_guard_refuses(tmp_path, args, env, message):
    result = run_recipe("qwen2.5-math-1.5b.sh", tmp_path, *args, **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not result.stdout


def test_context_guard_reads_a_local_model_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    result = run_recipe("qwen2.5-7b.sh", tmp_path, MODEL_PATH=str(model))
    assert result.returncode == 2
    assert (f"prompt + response = 2048 + 8192 = 10240 tokens exceeds the model's context of 2048 tokens "
            f"({model}/config.json)") in result.stderr


def test_val_only_evaluates_one_checkpoint_in_full(tmp_path):
    ckpt = tmp_path / "runs" / "tepo-x-seed1" / "checkpoints" / "global_step_40"
    (ckpt / "actor").mkdir(parents=True)
    cfg = dry_config("qwen2.5-math-1.5b.sh", tmp_path, VAL_ONLY="1", CKPT=str(ckpt))
    trainer = cfg.trainer
    assert trainer.val_only is True and trainer.val_before_train is True
    assert (trainer.resume_mode, trainer.resume_from_path) == ("resume_path", str(ckpt))
    assert list(cfg.actor_rollout_ref.actor.checkpoint.load_contents) == ["model"]
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 16 and cfg.data.val_max_samples == -1
    assert trainer.validation_data_dir == str(ckpt.parent.parent / "eval_generations")
    assert list(trainer.logger) == ["console"]
    assert "TEPO_VERL_COMPARE_METRICS" not in (OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars") or {})
    assert cfg.actor_rollout_ref.rollout.val_kwargs.do_sample and cfg.actor_rollout_ref.rollout.val_kwargs.top_p == 0.95


@pytest.mark.parametrize("env,message", [
    ({"ALGO": "ppo"}, "unknown ALGO='ppo'; valid: " + " ".join(sorted(p.stem for p in (
        REPO / "tepo_verl" / "config" / "algorithm").glob("*.yaml")))),
    ({"MODEL_PATH": ""}, "MODEL_PATH is empty"),
    ({"MODEL_PATH": "/nonexistent/model"}, "MODEL_PATH='/nonexistent/model' is not an existing folder"),
    ({"MAX_CKPT_TO_KEEP": "all"}, "MAX_CKPT_TO_KEEP must be an integer >= 1, got 'all'"),
    ({"OFFLOAD": "yes"}, "OFFLOAD must be 0 or 1, got 'yes'"),
    ({"ROLLOUT_TP": "3"}, "ROLLOUT_TP=3 does not divide the 8 GPUs"),
    ({"VAL_ONLY": "1"}, "VAL_ONLY=1 needs CKPT=<run>/checkpoints/global_step_N"),
    ({"VAL_ONLY": "1", "CKPT": "/nonexistent/global_step_3"},
     "CKPT='/nonexistent/global_step_3' is not an existing folder"),
    ({"VAL_ONLY": "1", "CKPT": "/"}, "CKPT='/' must be a checkpoint folder named global_step_N"),
    ({"VAL_ONLY": "yes"}, "VAL_ONLY must be 0 or 1, got 'yes'"),
    ({"DRY_RUN": "yes"}, "DRY_RUN must be 0, 1 or args, got 'yes'"),
])
def test_bad_values_stop_with_a_clear_message(tmp_path, env, message):
    result = run_recipe("qwen2.5-math-1.5b.sh", tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_recipe_docs_cover_every_recipe():
    doc = (REPO / "docs" / "recipes.md").read_text()
    readme = (REPO / "README.md").read_text()
    for recipe in RECIPES:
        assert f"`{recipe}`" in doc and f"`{recipe}`" in readme, recipe
    assert "docs/recipes.md" in readme
