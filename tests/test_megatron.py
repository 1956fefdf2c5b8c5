"""verl's Megatron route: every preset (iterated over the preset folder) composes on verl's Megatron config
(`--config-name ppo_megatron_trainer`, and the recipes' `model_engine=megatron`) with its TEPO (or baseline) estimator
and loss, the same keys as on the FSDP config; the GPU recipes' ENGINE=megatron sets the Megatron keys docs/recipes.md
reasons out, the adapter's own checks fire on that config too, and `strategy=megatron` on the FSDP config is refused in
the driver in one line."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files

import fresh_python
import pytest
import verl  # noqa: F401  (loads the plugin first, as in every verl process)
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from test_presets_and_checks import DEFINING_KEYS
from test_recipes import dry_config, flatten, run_recipe, verl_args
from verl_config import command_line_config, compose_config

from tepo_verl.verl_adapter.checks import TepoConfigError, check_tepo_config

PRESETS = sorted(p.name[:-len(".yaml")] for p in (files("tepo_verl.config") / "algorithm").iterdir()
                 if p.name.endswith(".yaml"))
MEGATRON_CONFIG = "ppo_megatron_trainer"
TEPO_TARGET = "tepo_verl.verl_adapter.config.TepoPolicyLossConfig"


def preset_keys(name: str) -> dict:
    """The keys that define the preset's algorithm, with their values: every key its file sets (the presets are the
    spec), and the keys every preset sets, as they compose on verl's default (FSDP) config."""
    tree = OmegaConf.to_container(OmegaConf.load(str(files("tepo_verl.config") / "algorithm" / f"{name}.yaml")))
    own = {key: value for key, value in flatten(tree).items() if not key.startswith("defaults")}
    fsdp = compose_config([f"+algorithm={name}"])
    return {**{key: OmegaConf.select(fsdp, key) for key in DEFINING_KEYS}, **own}


def _cli(*args, cwd):
    return fresh_python.run(["-m", "verl.trainer.main_ppo", *args], timeout=600, cwd=cwd,
                            env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})


def megatron_config(overrides):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name=MEGATRON_CONFIG, overrides=list(overrides))


@pytest.fixture(scope="module")
def megatron_recipe_runs(tmp_path_factory):
    """The config of the Qwen3-14B recipe with ENGINE=megatron per preset: the arguments it would give verl
    (DRY_RUN=args), composed as `python -m verl.trainer.main_ppo ARGS --cfg job` does (tests/test_recipes.py)."""
    tmp = tmp_path_factory.mktemp("megatron")
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip(PRESETS, pool.map(lambda name: run_recipe("qwen3-14b.sh", tmp, ALGO=name,
                                                                     ENGINE="megatron"), PRESETS)))
    return {name: flatten(OmegaConf.to_container(command_line_config(verl_args(result))))
            for name, result in results.items()}


def assert_the_preset_algorithm(cfg: dict, name: str) -> None:
    assert cfg["actor_rollout_ref.actor.strategy"] == "megatron"
    assert cfg["actor_rollout_ref.ref.strategy"] == "megatron"
    for key, value in preset_keys(name).items():
        assert cfg[key] == value, (name, key)
    if cfg["actor_rollout_ref.actor.policy_loss.loss_mode"] == "tepo":  # TEPO's estimator, loss and options
        assert cfg["algorithm.adv_estimator"] == "tepo"
        assert cfg["actor_rollout_ref.actor.policy_loss._target_"] == TEPO_TARGET
        assert "actor_rollout_ref.actor.policy_loss.tepo.mask_rule" in cfg


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_composes_on_the_megatron_config(name):
    assert_the_preset_algorithm(flatten(OmegaConf.to_container(megatron_config([f"+algorithm={name}"]))), name)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_composes_in_the_megatron_recipe(megatron_recipe_runs, name):
    assert_the_preset_algorithm(megatron_recipe_runs[name], name)


def test_the_cli_composes_algorithm_tepo_on_the_megatron_config(tmp_path):
    """The real command line on the Megatron config; the recipe tests compose the same way in their process."""
    result = _cli("--config-name", MEGATRON_CONFIG, "algorithm=tepo", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = OmegaConf.to_container(OmegaConf.create(result.stdout))
    assert_the_preset_algorithm(flatten(printed), "tepo")
    assert OmegaConf.to_container(command_line_config(["algorithm=tepo"], MEGATRON_CONFIG)) == printed


@pytest.mark.parametrize("name", PRESETS)
def test_the_megatron_recipe_sets_the_reasoned_keys(megatron_recipe_runs, name):
    """docs/recipes.md: Qwen3-14B on Megatron with TP 4, PP 1, CP 1, offload, full recompute; the budgets and the
    rollout as with FSDP; no FSDP-only key."""
    cfg = megatron_recipe_runs[name]
    megatron = "actor_rollout_ref.actor.megatron."
    assert (cfg[megatron + "tensor_model_parallel_size"], cfg[megatron + "pipeline_model_parallel_size"],
            cfg[megatron + "context_parallel_size"]) == (4, 1, 1)
    assert cfg[megatron + "param_offload"] is True and cfg[megatron + "optimizer_offload"] is True
    assert cfg[megatron + "override_transformer_config.recompute_granularity"] == "full"
    assert cfg[megatron + "override_transformer_config.recompute_num_layers"] == 1
    assert cfg["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert cfg["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 2 * (2048 + 8192)
    assert cfg["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
    assert not any(key.startswith("actor_rollout_ref.actor.fsdp_config.") for key in cfg)


def test_megatron_recipe_cluster_variables(tmp_path):
    cfg = dry_config("qwen3-14b.sh", tmp_path, ENGINE="megatron", NNODES="2", MEGATRON_TP="8", MEGATRON_PP="2",
                     MEGATRON_CP="1", OFFLOAD="0")
    megatron = cfg.actor_rollout_ref.actor.megatron
    assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size) == (8, 2)
    assert megatron.param_offload is False and cfg.trainer.nnodes == 2
    # the reference follows the actor's parallel sizes (verl's megatron_ref.yaml interpolates them)
    assert OmegaConf.select(cfg, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size") == 8


@pytest.mark.parametrize("env, message", [
    ({"ENGINE": "deepspeed"}, "ENGINE must be fsdp or megatron, got 'deepspeed'"),
    ({"ENGINE": "megatron", "SP": "2"}, "SP=2 is the FSDP engine's Ulysses sequence parallelism"),
    ({"ENGINE": "megatron", "MEGATRON_TP": "3"}, "MEGATRON_TP x MEGATRON_PP x MEGATRON_CP = 3 x 1 x 1 does not "
                                                 "divide the 8 GPUs"),
    ({"ENGINE": "megatron", "MEGATRON_TP": "16", "NNODES": "2"}, "MEGATRON_TP=16 exceeds GPUS_PER_NODE=8"),
    ({"ENGINE": "megatron", "MEGATRON_CP": "0"}, "MEGATRON_CP must be an integer >= 1, got '0'"),
])
def test_bad_megatron_settings_stop_with_one_line(tmp_path, env, message):
    result = run_recipe("qwen3-14b.sh", tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr


# ------------------------------------------------------------------ the adapter's checks on the Megatron config

@pytest.mark.parametrize("overrides, message", [
    (["+algorithm=tepo", "trainer.use_v1=False", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old"],
     "mask_rule=old needs the current-policy entropy H"),
    (["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal"],
     "mask_rule=surprisal needs the current-policy entropy H"),
    (["+algorithm=tepo", "actor_rollout_ref.actor.policy_loss.tepo.kl_target=ref"],
     "policy_loss.tepo.kl_target=ref needs a reference model"),
    (["+algorithm=tepo", "algorithm.rollout_correction.bypass_mode=True"],
     "bypass_mode=True: verl would silently replace the loss"),
])
def test_the_adapters_checks_fire_on_the_megatron_config(overrides, message):
    cfg = megatron_config(overrides)
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"
    with pytest.raises(TepoConfigError, match=message):
        check_tepo_config(cfg)


def test_a_correct_megatron_config_passes_the_checks_and_verls_validation():
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = megatron_config(["+algorithm=tepo", "actor_rollout_ref.actor.use_dynamic_bsz=True"])
    check_tepo_config(cfg)
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # what the Megatron workers build
    assert type(actor).__name__ == "McoreActorConfig" and actor.policy_loss.tepo.mask_rule == "surprisal_old"


# ------------------------------------------------------------------ strategy=megatron on the FSDP config

def test_megatron_strategy_on_the_fsdp_config_is_refused_in_the_driver_in_one_line(tmp_path):
    result = _cli("algorithm=tepo", "actor_rollout_ref.actor.strategy=megatron",
                  "actor_rollout_ref.actor.use_dynamic_bsz=True", cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("tepo_verl.verl_adapter.checks.")]
    assert lines == [
        "tepo_verl.verl_adapter.checks.TepoConfigError: actor_rollout_ref.actor.strategy=megatron on a config without "
        "actor_rollout_ref.actor.megatron (composed for another engine): compose verl's Megatron config instead: "
        "python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer ... (or model_engine=megatron), which sets "
        "the strategy itself"], result.stderr[-3000:]
    assert "not in struct" not in result.stderr  # verl's own traceback is never reached
    assert "ray init kwargs" not in result.stdout  # refused before Ray starts


@pytest.mark.parametrize("overrides", [
    ["+algorithm=grpo", "actor_rollout_ref.ref.strategy=megatron"],
    ["+algorithm=gspo", "actor_rollout_ref.actor.strategy=megatron"],
])
def test_the_engine_check_holds_for_every_algorithm_and_the_reference(overrides):
    with pytest.raises(TepoConfigError, match=r"strategy=megatron on a config without .*--config-name "
                                              r"ppo_megatron_trainer"):
        check_tepo_config(compose_config(overrides))


def test_fsdp_strategy_on_the_megatron_config_is_refused_too():
    with pytest.raises(TepoConfigError, match="strategy=fsdp2 on a config without actor_rollout_ref.actor.fsdp_config"):
        check_tepo_config(megatron_config(["+algorithm=grpo", "actor_rollout_ref.actor.strategy=fsdp2"]))

