"""The Hydra presets, the `algorithm=NAME` command line, misconfiguration checks and the plugin's loading."""

from __future__ import annotations

import dataclasses
import os
import sys

import fresh_python
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl_config import actor_config, actor_of, command_line_config, compose_config

from tepo_verl.core.options import TepoOptions
from tepo_verl.verl_adapter.checks import TepoConfigError, check_tepo_config
from tepo_verl.verl_adapter.cli import is_verl_command, normalize_algorithm_override, rewrite_sys_argv
from tepo_verl.verl_adapter.version_check import UnsupportedVerlVersion, check_verl_version

pytestmark = pytest.mark.verl_090  # also run on verl 0.9.0 (make test-090, docs/testing.md)

PRESETS = {
    "tepo": {"algorithm.adv_estimator": "tepo", "actor_rollout_ref.actor.policy_loss.loss_mode": "tepo",
             "actor_rollout_ref.actor.clip_ratio_low": 3e-4, "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
             "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
             "actor_rollout_ref.actor.calculate_entropy": False, "actor_rollout_ref.actor.use_kl_loss": False,
             "actor_rollout_ref.actor.policy_loss.tepo.mask_rule": "surprisal_old",
             "algorithm.filter_groups.enable": False},
    "tepo_nomask": {"algorithm.adv_estimator": "tepo", "actor_rollout_ref.actor.policy_loss.loss_mode": "tepo",
                    "actor_rollout_ref.actor.policy_loss.tepo.mask_rule": "off",
                    "actor_rollout_ref.actor.clip_ratio_high": 4e-4},
    "gspo": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
             "actor_rollout_ref.actor.clip_ratio_low": 3e-4, "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
             "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
             "actor_rollout_ref.actor.calculate_entropy": False, "actor_rollout_ref.actor.use_kl_loss": False,
             "algorithm.filter_groups.enable": False},
    "grpo": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
             "actor_rollout_ref.actor.clip_ratio_low": 0.2, "actor_rollout_ref.actor.clip_ratio_high": 0.2,
             "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
             "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
             "algorithm.filter_groups.enable": False},
    "dapo": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
             "actor_rollout_ref.actor.clip_ratio_low": 0.2, "actor_rollout_ref.actor.clip_ratio_high": 0.28,
             "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": False,
             "algorithm.filter_groups.enable": True, "algorithm.filter_groups.max_num_gen_batches": 0},
    "gmpo": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "geo_mean",
             "actor_rollout_ref.actor.clip_ratio_low": 0.4, "actor_rollout_ref.actor.clip_ratio_high": 0.4,
             "actor_rollout_ref.actor.use_kl_loss": False, "algorithm.filter_groups.enable": False},
    "kl_cov": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "kl_cov",
               "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": 0.002,
               "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": 1.0,
               "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": False,
               "algorithm.filter_groups.enable": False},
    "dr_grpo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False,
                "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
                "actor_rollout_ref.actor.clip_ratio_low": 0.2, "actor_rollout_ref.actor.clip_ratio_high": 0.2,
                "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
                "actor_rollout_ref.actor.loss_scale_factor": 512,  # verl's default data.max_response_length
                "actor_rollout_ref.actor.use_kl_loss": False, "algorithm.filter_groups.enable": False},
    "cispo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True,
              "actor_rollout_ref.actor.policy_loss.loss_mode": "cispo",
              "actor_rollout_ref.actor.clip_ratio_low": 10.0, "actor_rollout_ref.actor.clip_ratio_high": 0.2,
              "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": True,
              "actor_rollout_ref.actor.kl_loss_coef": 0.001, "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
              "algorithm.filter_groups.enable": False},
    "sapo": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "sapo",
             "actor_rollout_ref.actor.tau_pos": 1.0, "actor_rollout_ref.actor.tau_neg": 1.05,
             "actor_rollout_ref.actor.use_kl_loss": False, "algorithm.filter_groups.enable": False},
    "clip_cov": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "clip_cov",
                 "actor_rollout_ref.actor.clip_ratio_low": 1.0, "actor_rollout_ref.actor.clip_ratio_high": 1.0,
                 "actor_rollout_ref.actor.clip_ratio_c": 10.0,
                 "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": 0.0002,
                 "actor_rollout_ref.actor.policy_loss.clip_cov_lb": 1.0,
                 "actor_rollout_ref.actor.policy_loss.clip_cov_ub": 5.0,
                 "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": False,
                 "algorithm.filter_groups.enable": False},
}

#: Keys every preset sets, so that a comparison differs in the preset alone.
DEFINING_KEYS = ["algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode",
                 "actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_high",
                 "actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.calculate_entropy",
                 "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.entropy_coeff",
                 "algorithm.use_kl_in_reward", "algorithm.filter_groups.enable",
                 "algorithm.filter_groups.metric"]  # verl 0.9.0's default is null, 0.9.1's `reward`


def _cli(*args, env=None, cwd="/"):
    return fresh_python.run(["-m", "verl.trainer.main_ppo", *args], env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_compose_with_the_defining_keys(name):
    cfg = compose_config([f"+algorithm={name}"])
    for key, expected in PRESETS[name].items():
        assert OmegaConf.select(cfg, key) == expected, key
    check_tepo_config(cfg)  # every preset is a valid configuration
    actor = actor_of(cfg)  # and verl builds its actor dataclass from it, as the workers do
    assert actor.policy_loss.loss_mode == PRESETS[name]["actor_rollout_ref.actor.policy_loss.loss_mode"]


def test_dr_grpos_loss_scale_factor_follows_the_response_length():
    """Dr. GRPO's constant normaliser is the run's data.max_response_length, for the actor and (through verl's own
    interpolation) the critic."""
    overrides = ["+algorithm=dr_grpo", "data.max_response_length=3072"]
    cfg = compose_config(overrides)
    assert OmegaConf.select(cfg, "actor_rollout_ref.actor.loss_scale_factor") == 3072
    assert OmegaConf.select(cfg, "critic.loss_scale_factor") == 3072
    assert actor_of(cfg).loss_scale_factor == 3072
    assert actor_config(["+algorithm=grpo"]).loss_scale_factor is None  # verl's default; unread by other modes


def test_every_preset_sets_every_defining_key():
    """Each preset file (with what it inherits through its defaults list) sets every defining key itself, so that
    no comparison inherits one of them from verl's base config."""
    from importlib.resources import files

    folder = files("tepo_verl.config") / "algorithm"

    def own_keys(name: str):
        preset = OmegaConf.create((folder / f"{name}.yaml").read_text())
        inherited = [entry for entry in preset.get("defaults", []) if isinstance(entry, str) and entry != "_self_"]
        return OmegaConf.merge(*(own_keys(parent) for parent in inherited), preset)

    names = sorted(p.name[:-len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
    assert set(PRESETS) <= set(names)
    for name in names:
        merged = own_keys(name)
        for key in DEFINING_KEYS:
            assert OmegaConf.select(merged, key) is not None, (name, key)


def test_main_ppo_cfg_job_with_the_stock_entry_point():
    """The real command line, `algorithm=tepo` without Hydra's `+` (the plugin rewrites it in the driver). Its config
    is the one composed in this process from either spelling (verl_config.command_line_config, which the recipe
    tests use)."""
    result = _cli("algorithm=tepo", "--cfg", "job")
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = OmegaConf.create(result.stdout)
    assert cfg.algorithm.adv_estimator == "tepo"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "tepo"
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == "tepo_verl.verl_adapter.config.TepoPolicyLossConfig"
    # every option is in the preset (so each is an ordinary override), at its documented default
    assert OmegaConf.to_container(cfg.actor_rollout_ref.actor.policy_loss.tepo) == TepoOptions().to_dict()
    for spelling in ("algorithm=tepo", "+algorithm=tepo"):
        assert OmegaConf.to_container(command_line_config([spelling])) == OmegaConf.to_container(cfg), spelling


@pytest.mark.parametrize("changed", [
    {"mask_rule": "always"}, {"mask_rule": "always", "mask_advantage": "any"}, {"mask_top_frac": 0.2},
    {"mask_old_rtol": 0.0},
], ids=str)
def test_the_control_variants_are_plain_overrides_of_the_preset(changed):
    overrides = ["+algorithm=tepo", *(f"actor_rollout_ref.actor.policy_loss.tepo.{k}={v}" for k, v in changed.items())]
    assert actor_config(overrides).policy_loss.tepo == dataclasses.replace(TepoOptions(), **changed)
    check_tepo_config(compose_config(overrides))


def test_unknown_preset_lists_the_available_ones():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as error:
        command_line_config(["algorithm=tepoo"])
    assert "Could not find 'algorithm/tepoo'" in str(error.value)
    for name in PRESETS:
        assert name in str(error.value)


def test_argv_rewrite_can_be_turned_off(monkeypatch):
    """TEPO_VERL_REWRITE_ARGV=0 leaves a verl command's arguments as typed, and Hydra then refuses `algorithm=`."""
    from hydra.errors import ConfigCompositionException

    command = ["python", "-m", "verl.trainer.main_ppo", "algorithm=tepo", "--cfg", "job"]
    monkeypatch.setattr(sys, "orig_argv", command)
    for switch, expected in (("1", "+algorithm=tepo"), ("0", "algorithm=tepo")):
        monkeypatch.setenv("TEPO_VERL_REWRITE_ARGV", switch)
        monkeypatch.setattr(sys, "argv", ["main_ppo.py", *command[3:]])
        rewrite_sys_argv()
        assert sys.argv[1:] == [expected, "--cfg", "job"], switch
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        with pytest.raises(ConfigCompositionException, match="Could not override 'algorithm'"):
            compose(config_name="ppo_trainer", overrides=sys.argv[1:2])


def test_normalize_algorithm_override():
    argv = ["algorithm=tepo", "+algorithm=grpo", "algorithm.gamma=0.9", "data.algorithm=tepo", "x=algorithm=tepo",
            "algorithm=tepo_nomask", "~algorithm"]
    assert normalize_algorithm_override(argv) == [
        "+algorithm=tepo", "+algorithm=grpo", "algorithm.gamma=0.9", "data.algorithm=tepo", "x=algorithm=tepo",
        "+algorithm=tepo_nomask", "~algorithm"]
    assert is_verl_command(["python", "-m", "verl.trainer.main_ppo", "algorithm=tepo"], "-m")
    assert not is_verl_command(["python", "-m", "pytest", "algorithm=tepo"], "-m")
    assert not is_verl_command(["python", "train.py"], "train.py")


# ------------------------------------------------------------------ misconfigurations caught early

BAD_CONFIGS = [
    (["algorithm.rollout_correction.bypass_mode=True"], r"bypass_mode=True: verl would silently replace the loss"),
    (["actor_rollout_ref.actor.policy_loss.tepo.kl_target=ref"], r"kl_target=ref needs a reference model"),
    (["actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal"],
     r"mask_rule=surprisal needs the current-policy entropy.*actor_rollout_ref\.actor\.calculate_entropy=True"),
    (["actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old", "trainer.use_v1=False"],
     r"mask_rule=old needs the current-policy entropy.*actor_rollout_ref\.actor\.calculate_entropy=True"),
    (["actor_rollout_ref.actor.policy_loss.tepo.mask_rule=entropy"],
     r"mask_rule='entropy' is not valid; valid values: surprisal_old, surprisal, old, always, off"),
    (["+actor_rollout_ref.actor.policy_loss.tepo.beta=1"], r"Unknown TEPO option\(s\) \['beta'\]"),
    (["actor_rollout_ref.actor.policy_loss._target_=verl.workers.config.PolicyLossConfig"],
     r"policy_loss\._target_=tepo_verl\.verl_adapter\.config\.TepoPolicyLossConfig"),
]


@pytest.mark.parametrize("overrides,message", BAD_CONFIGS)
def test_misconfigurations_are_caught_in_verl_validate_config(overrides, message):
    from verl.utils.config import validate_config  # the driver's entry, wrapped by the plugin

    cfg = compose_config(["+algorithm=tepo", *overrides])
    with pytest.raises(TepoConfigError, match=message):
        validate_config(cfg, use_reference_policy=False, use_critic=False)


@pytest.mark.parametrize("overrides", [
    ["actor_rollout_ref.actor.policy_loss.tepo.kl_target=ref", "actor_rollout_ref.actor.use_kl_loss=True",
     "actor_rollout_ref.actor.kl_loss_coef=0"],
    ["actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal",
     "actor_rollout_ref.actor.policy_loss.tepo.mask_fallback=surprisal_old"],
    ["actor_rollout_ref.actor.policy_loss.tepo.mask_rule=surprisal", "actor_rollout_ref.actor.calculate_entropy=True"],
    ["actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old", "actor_rollout_ref.actor.entropy_coeff=0.01"],
    ["actor_rollout_ref.actor.policy_loss.tepo.kl_target=ref",
     "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=off"],
    ["trainer.use_v1=False"],  # the legacy trainer: the plugin keeps the old entropy it computes (legacy_trainer.py)
    ["trainer.use_v1=False", "actor_rollout_ref.actor.policy_loss.tepo.mask_rule=old",
     "actor_rollout_ref.actor.calculate_entropy=True"],
])
def test_valid_variants_pass_the_checks(overrides):
    check_tepo_config(compose_config(["+algorithm=tepo", *overrides]))


def test_non_tepo_configs_are_not_checked():
    check_tepo_config(compose_config(["algorithm.rollout_correction.bypass_mode=True"]))
    check_tepo_config(compose_config(["+algorithm=dapo", "algorithm.rollout_correction.bypass_mode=True"]))


def test_checks_run_in_the_real_main_before_any_worker_starts():
    result = _cli("algorithm=tepo", "algorithm.rollout_correction.bypass_mode=True",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert result.returncode != 0
    assert "TepoConfigError" in result.stderr and "bypass_mode=True" in result.stderr
    assert "ray.init" not in result.stderr.lower()


def test_verl_version_outside_the_supported_range_is_refused():
    for good in ("0.9.0", "0.9.1", "0.9.2"):
        assert check_verl_version(good) == good
    for bad in ("0.8.0", "0.8.5", "0.9.0rc1", "0.10.0", "1.0.0"):
        with pytest.raises(UnsupportedVerlVersion) as refused:
            check_verl_version(bad)
        assert str(refused.value) == (
            f"tepo-verl supports verl >=0.9.0,<0.10 (tested with 0.9.0 and 0.9.1); installed verl is {bad}. "
            "Install a supported verl: pip install 'verl>=0.9.0,<0.10'")


def test_a_verl_command_on_verl_0_8_names_the_supported_range_in_one_line():
    """verl 0.8 loads no plugins, so only Hydra's search-path plugin sees the preset: it names the version."""
    from hydra_plugins.tepo_verl_searchpath import plugin_not_loaded_message

    message = plugin_not_loaded_message(["algorithm=tepo"], "auto", verl_version="0.8.0")
    assert message == ("algorithm=tepo is a tepo-verl preset, but tepo-verl supports verl >=0.9.0,<0.10 (tested with "
                       "0.9.0 and 0.9.1); installed verl is 0.8.0. Install a supported verl: pip install "
                       "'verl>=0.9.0,<0.10'")
    # a supported verl keeps the reason about the plugin's loading
    assert "VERL_USE_EXTERNAL_PLUGINS=none" in plugin_not_loaded_message(["algorithm=tepo"], "none", "0.9.0")


# ------------------------------------------------------------------ plugin loading in a fresh process

def _python(code, env=None):
    return fresh_python.run(["-c", code], env={**os.environ, **(env or {})}, cwd="/")


def test_import_verl_alone_registers_tepo_in_a_fresh_process():
    result = _python(
        "import verl\n"
        "from verl.trainer.ppo import core_algos as c\n"
        "from verl.workers.utils import losses\n"
        "print(c.get_policy_loss_fn('tepo').__module__, c.get_adv_estimator_fn('tepo').__module__,"
        " losses.ppo_loss.__name__)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["tepo_verl.verl_adapter.registry", "tepo_verl.verl_adapter.registry",
                                     "tepo_aware_ppo_loss"]


def test_a_load_failure_is_loud_and_selecting_tepo_raises_it():
    result = _python(
        "from packaging.specifiers import SpecifierSet\n"
        "import tepo_verl.verl_adapter.version_check as v\n"
        "v.SUPPORTED_VERL = SpecifierSet('<0.1')\n"
        "import verl\n"
        "from verl.trainer.ppo import core_algos as c\n"
        "c.get_policy_loss_fn('tepo')()\n")
    assert result.returncode != 0
    assert "[tepo-verl] ERROR: the TEPO plugin failed to load" in result.stderr
    assert "RuntimeError: tepo-verl failed to load, so 'tepo' cannot run" in result.stderr
    assert "UnsupportedVerlVersion" in result.stderr


def test_every_preset_name_resolves_to_our_file_and_nothing_else():
    """The presets live in verl's own `algorithm` config group: if verl (or another plugin) ever ships an
    algorithm/<name>.yaml of the same name, a composed preset could silently be theirs. Only tepo-verl's search
    path entry may provide each name."""
    from importlib.resources import files

    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    ours = sorted(p.name[:-len(".yaml")] for p in (files("tepo_verl.config") / "algorithm").iterdir()
                  if p.name.endswith(".yaml"))
    assert set(PRESETS) <= set(ours)
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        sources = GlobalHydra.instance().config_loader().get_sources()
        for name in ours:
            providers = [s.provider for s in sources if s.is_config(f"algorithm/{name}")]
            assert providers == ["tepo-verl"], (name, providers)
