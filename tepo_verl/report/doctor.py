"""`tepo-verl doctor RUN`: read one run and say, one line per check with its fix, whether it is healthy.

RUN is a run folder (with a verl file-logger `metrics.jsonl`, or the `metrics.jsonl.gz` a study keeps) or the
metrics file itself, plain or gzip-compressed. Beside the metrics the doctor also reads, when they are there: the
composed config (`--config FILE`, else Hydra's `.hydra/config.yaml` under the folder, else a `config.yaml` beside
the metrics; a `--cfg job` dump works), the console (`--console FILE`, else `console.log`, which `recipes/cpu.sh`
writes), and the study's `run.json` (preset and overrides). Every check says where its evidence came from and
says "unknown" when the run does not reveal it. The checks that only apply to TEPO say "n/a" on GRPO, DAPO and
GSPO runs.

Statuses: ok, note (context, not judged), warn (look at it), FAIL (the run is not measuring what it should),
unknown, n/a. Exit code: 0 when no check fails (warnings included, unless --strict), 1 when one fails (or, with
--strict, warns), 2 when the run cannot be read. A half-written last line (a run still writing, or killed) is
skipped with a note.

verl logs one value per step, over all of the step's updates (micro-batches and mini-batches: a mean, or for
the tepo/ ratios the step's ratio of sums). The first
update of a step is on-policy (ratio 1 up to rounding on CPU; 1 plus numerical noise on a GPU), the later ones are
not, so the on-policy noise can be read from step metrics only when a step has one update, or from a metric that
the loss logs for the on-policy update itself (METRICS' noise roles).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from tepo_verl.core.options import TepoOptions
from tepo_verl.report.runs import (
    CLIP_FRAC,
    ENTROPY,
    GZIP_SUFFIX,
    MASK_FRAC,
    READ_ERRORS,
    VERL_ENTROPY,
    RunError,
    metrics_file,
    open_metrics,
)
from tepo_verl.verl_adapter.precision import FLOAT32_OVERRIDES, ratio_resolution

PRESET_DIR = Path(__file__).resolve().parents[1] / "config" / "algorithm"

#: What each check reads: role -> the metric names that carry it, first logged one wins (verl's file-logger names).
METRICS: dict[str, tuple[str, ...]] = {
    "clipfrac": (CLIP_FRAC,),
    "ppo_kl": ("actor/ppo_kl",),
    "seq_ratio_max": ("actor/tepo/seq_ratio_max",),
    "seq_ratio_min": ("actor/tepo/seq_ratio_min",),
    "mask_frac": (MASK_FRAC,),
    "mask_frac_positive": ("actor/tepo/mask_frac_positive",),
    "penalty_grad_share": ("actor/tepo/penalty_grad_share",),
    "mask_fallback": ("actor/tepo/mask_fallback_used",),
    "entropy": (ENTROPY, VERL_ENTROPY),
    "response_clip": ("response_length/clip_ratio",),
    "response_max": ("response_length/max",),
    "score_min": ("critic/score/min",),
    "score_max": ("critic/score/max",),
    "adv_min": ("critic/advantages/min",),
    "adv_max": ("critic/advantages/max",),
    "evicted": ("training/filter_groups/evicted_samples",),
    "rollout_probs_diff": ("training/rollout_probs_diff_mean",),
    # the on-policy update's numerical noise (NOISE_LEVELS): |log-ratio| statistics of the step's updates, which
    # are that noise only when the step has one update, or of the step's first (on-policy) mini-batch alone, which
    # the loss logs as well (ON_POLICY_ONLY names)
    "noise_sequence": ("actor/tepo/seq_log_ratio_abs_max", "actor/tepo/onpolicy_seq_log_ratio_abs_max"),
    "noise_token": ("actor/tepo/token_log_ratio_abs_max", "actor/tepo/onpolicy_token_log_ratio_abs_max",
                    "actor/tepo/token_log_ratio_abs_mean"),
}
#: The noise roles, read in this order: the sequence ratio is what TEPO and GSPO clip.
NOISE_LEVELS = (("noise_sequence", "sequence"), ("noise_token", "token"))
ON_POLICY_ONLY = "/onpolicy_"  # in a metric's name: logged for the step's on-policy update alone
MASK_RULE_PREFIX = "actor/tepo/mask_rule/"
KL_COEF = "actor_rollout_ref.actor.policy_loss.tepo.kl_coef"
MASK_RULE = "actor_rollout_ref.actor.policy_loss.tepo.mask_rule"
PRECISION_WARNING = re.compile(r"\[tepo-verl\] WARNING: the actor's log-probs arrive in torch\.(\w+)")

#: Thresholds of the judgements (fractions unless said otherwise).
CLIP_BINDS_ALL = 0.5  # mean clipped share above this: the clip range binds most of the update
NOISE_WARN = 0.1  # on-policy noise above this share of the clip range: the clip decision is partly noise
ENTROPY_COLLAPSE, ENTROPY_FALLING = 0.1, 0.5  # end/start entropy below these
TRUNCATED_WARN, TRUNCATED_FAIL = 0.05, 0.5  # share of responses at the length cap, last quarter of the run
MASK_POSITIVE_LOW, MASK_POSITIVE_HIGH = 0.01, 0.9
PENALTY_WEAK, PENALTY_STRONG = 0.01, 0.5  # the penalty's share of the |gradient| on masked tokens
NOISE_FIX = (f"widen the clip range past the noise, or cut the noise: a float32 actor ({FLOAT32_OVERRIDES[0]} and "
             "the same for ref), VERL_DISABLE_FLASH_ATTN_CE=1 (flash-attn's cross-entropy is not deterministic)")


@dataclasses.dataclass(frozen=True)
class Finding:
    status: str  # ok | note | warn | FAIL | unknown | n/a
    check: str
    message: str
    fix: str = ""

    def line(self) -> str:
        return f"[{self.status}] {self.check}: {self.message}" + (f" -> fix: {self.fix}" if self.fix else "")


@dataclasses.dataclass
class Evidence:
    """What one run reveals: its metrics per step, its (possibly partial) config, its console text."""

    metrics: dict[int, dict[str, float]]
    config: DictConfig | None = None
    config_source: str = ""
    console: str | None = None
    truncated_last_line: bool = False

    def series(self, role: str) -> list[float]:
        """The finite values of a role's first logged metric, in step order."""
        for name in METRICS[role]:
            if values := self.values_of(name):
                return values
        return []

    def values_of(self, name: str) -> list[float]:
        """The finite values of one metric, in step order."""
        return [m[name] for _, m in sorted(self.metrics.items()) if _finite(m.get(name))]

    def name_of(self, role: str) -> str:
        return next((n for n in METRICS[role] if any(n in m for m in self.metrics.values())), METRICS[role][0])

    def setting(self, key: str):
        if self.config is None:
            return None
        return OmegaConf.select(self.config, key, default=None, throw_on_resolution_failure=False)

    def logged_mask_rules(self) -> list[str]:
        """The TEPO mask rules that ran, sorted (actor/tepo/mask_rule/<name>)."""
        return sorted({k[len(MASK_RULE_PREFIX):] for m in self.metrics.values() for k in m
                       if k.startswith(MASK_RULE_PREFIX)})

    def mask_rule(self) -> str | None:
        """The TEPO mask rule: the configured one, else the only one logged."""
        configured = self.setting(MASK_RULE)
        if configured:
            return str(configured)
        logged = self.logged_mask_rules()
        return logged[0] if len(logged) == 1 else None

    @property
    def is_tepo(self) -> bool:
        return self.setting("actor_rollout_ref.actor.policy_loss.loss_mode") == "tepo" or any(
            k.startswith("actor/tepo/") for m in self.metrics.values() for k in m)

    def clip_range(self) -> tuple[float, float] | None:
        low = self.setting("actor_rollout_ref.actor.clip_ratio_low")
        high = self.setting("actor_rollout_ref.actor.clip_ratio_high")
        return (float(low), float(high)) if _finite(low) and _finite(high) else None

    def updates_per_step(self) -> int | None:
        """ppo_epochs x mini-batches per step, when the config gives the batch sizes (DAPO's refills aside)."""
        batch = self.setting("data.train_batch_size")
        mini = self.setting("actor_rollout_ref.actor.ppo_mini_batch_size")
        epochs = self.setting("actor_rollout_ref.actor.ppo_epochs") or 1
        if not (isinstance(batch, int) and isinstance(mini, int) and mini > 0):
            return None
        return int(epochs) * max(1, batch // mini)


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _median(values: list[float]) -> float:
    return statistics.median(values)


# ---------------------------------------------------------------------------------------------------------- reading


def load_metrics(path: Path) -> tuple[dict[int, dict[str, float]], bool]:
    """step -> merged metrics, and whether a half-written last line was skipped. Any other bad line is an error."""
    try:
        with open_metrics(path) as handle:
            lines = handle.read().splitlines()
    except READ_ERRORS as error:
        raise RunError(f"cannot read run file {path}: {error}") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    metrics: dict[int, dict[str, float]] = {}
    truncated = False
    for index, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
            step, data = int(record["step"]), record["data"]
            if not isinstance(data, dict):
                raise TypeError("data is not an object")
        except (ValueError, KeyError, TypeError) as error:
            if index == len(numbered) - 1 and index > 0 and isinstance(error, ValueError):
                truncated = True  # the writer was cut off mid-line
                break
            raise RunError(f"{path}:{number}: not a verl file-logger record ({error})") from None
        metrics.setdefault(step, {}).update(data)
    if not metrics:
        raise RunError(f"{path}: no file-logger records")
    return metrics, truncated


def locate(run: Path) -> Path:
    """The metrics file of RUN: the file itself, or the folder's metrics file (runs.metrics_file: metrics.jsonl or
    metrics.jsonl.gz), or else its only *.jsonl or *.jsonl.gz."""
    if run.is_file():
        return run
    if not run.is_dir():
        raise RunError(f"run {run} does not exist (give a run folder with a metrics.jsonl, or the .jsonl file)")
    if metrics_file(run).is_file():
        return metrics_file(run)
    candidates = sorted({*run.glob("*.jsonl"), *run.glob("*.jsonl" + GZIP_SUFFIX)})
    if len(candidates) == 1:
        return candidates[0]
    raise RunError(f"run folder {run} has no metrics.jsonl or metrics.jsonl.gz"
                   + (f" and several metrics files ({', '.join(c.name for c in candidates)}): give one" if candidates
                      else " (verl's file logger writes it where VERL_FILE_LOGGER_PATH points)"))


def find_config(folder: Path) -> Path | None:
    hydra = sorted(folder.rglob(".hydra/config.yaml"), key=lambda p: p.stat().st_mtime)
    if hydra:
        return hydra[-1]
    return folder / "config.yaml" if (folder / "config.yaml").is_file() else None


def load_config_file(path: Path) -> DictConfig:
    """A composed config: Hydra's .hydra/config.yaml or a `--cfg job` dump (anything before its first key is
    passed over: verl's warnings)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RunError(f"cannot read config {path}: {error}") from None
    start = re.search(r"^(actor_rollout_ref|algorithm|data|trainer|critic|reward_model|ray_kwargs)\s*:", text, re.M)
    try:
        config = OmegaConf.create(text[start.start():] if start else text)
    except Exception as error:  # noqa: BLE001 - omegaconf/yaml raise many types; one line for the user
        raise RunError(f"config {path} is not YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(config, DictConfig) or "actor_rollout_ref" not in config:
        raise RunError(f"config {path} is not a composed verl config (no actor_rollout_ref)")
    return config


def config_from_record(path: Path) -> DictConfig | None:
    """The keys the doctor reads, from the study's run.json: its preset, its overrides, and recipes/cpu.sh's
    regime (prompts per step and per mini-batch, the precision; the CPU device). The precision is the regime's
    PRECISION, else the one the command sets; a record with neither predates the recipe's PRECISION (bf16 then)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    preset = PRESET_DIR / f"{record.get('preset')}.yaml"
    if not preset.is_file():
        return None
    config = OmegaConf.load(preset)
    regime = record.get("regime") or {}
    if "recipes/cpu.sh" in str(record.get("command", "")):
        OmegaConf.update(config, "trainer.device", "cpu", force_add=True)
        if str(regime.get("BATCH", "")).isdigit() and str(regime.get("MINI", "")).isdigit():
            OmegaConf.update(config, "data.train_batch_size", int(regime["BATCH"]), force_add=True)
            OmegaConf.update(config, "actor_rollout_ref.actor.ppo_mini_batch_size", int(regime["MINI"]),
                             force_add=True)
    precision = regime.get("PRECISION") or _command_setting(str(record.get("command", "")), "PRECISION")
    overrides = [*(FLOAT32_OVERRIDES if precision == "float32" else ()), *record.get("overrides", [])]
    for override in OverridesParser.create().parse_overrides(overrides):
        OmegaConf.update(config, override.key_or_group, override.value(), force_add=True)
    return config


def _command_setting(command: str, name: str) -> str | None:
    """NAME's value among the VAR=value assignments that lead COMMAND (`TASK=chain PRECISION=float32 bash ...`)."""
    for word in command.split():
        key, sep, value = word.partition("=")
        if not sep or not key.isidentifier():
            return None
        if key == name:
            return value
    return None


def gather(run: Path, config: Path | None = None, console: Path | None = None) -> Evidence:
    metrics_path = locate(run)
    metrics, truncated = load_metrics(metrics_path)
    folder = metrics_path.parent
    evidence = Evidence(metrics=metrics, truncated_last_line=truncated)
    config = config or find_config(folder)
    if config is not None:
        evidence.config, evidence.config_source = load_config_file(config), str(config)
    elif (folder / "run.json").is_file():
        evidence.config = config_from_record(folder / "run.json")
        evidence.config_source = f"{folder / 'run.json'} (preset and overrides)" if evidence.config else ""
    console = console or (folder / "console.log" if (folder / "console.log").is_file() else None)
    if console is not None:
        try:
            evidence.console = console.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise RunError(f"cannot read console {console}: {error}") from None
    return evidence


# ----------------------------------------------------------------------------------------------------------- checks


def logprob_dtype(ev: Evidence) -> tuple[torch.dtype | None, str]:
    """The log-probs' dtype and how it is known: the adapter's warning in the console (read in the run), else the
    config with verl 0.9.1's rules (tepo_verl/verl_adapter/precision.py)."""
    if ev.console is not None:
        match = PRECISION_WARNING.search(ev.console)
        if match and isinstance(getattr(torch, match[1], None), torch.dtype):
            return getattr(torch, match[1]), "read by the adapter in the run (its warning in the console)"
    param = ev.setting("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype")
    device = ev.setting("trainer.device")
    if param in ("fp32", "float32"):
        return torch.float32, "from the config: mixed_precision.param_dtype=fp32, no autocast"
    if device is None:
        return None, ""
    if device == "cpu":
        return torch.bfloat16, "from the config: CPU under bf16 autocast, which keeps log_softmax in bf16"
    return torch.float32, (f"from the config: {device} under bf16 autocast, which runs log_softmax in float32 "
                           "(verl's source)")


def check_dtype(ev: Evidence) -> Finding:
    dtype, source = logprob_dtype(ev)
    clip = ev.clip_range()
    if dtype is None:
        return Finding("unknown", "log-prob dtype", "neither a console with tepo-verl's precision line nor a config "
                       "with the device", "keep console.log or pass --config (the composed config)")
    if clip is None:
        return Finding("unknown", "log-prob dtype", f"{str(dtype)[6:]}, {source}; the clip range is unknown",
                       "pass --config")
    step = ratio_resolution(dtype)
    text = f"{str(dtype)[6:]}, {source}; a ratio near 1 moves in steps of {step:.1e}"
    if step > min(clip):
        return Finding("FAIL", "log-prob dtype", f"{text}, coarser than the clip range {clip[0]:g}/{clip[1]:g}",
                       f"pass {' '.join(FLOAT32_OVERRIDES)}")
    fused = ev.setting("actor_rollout_ref.model.use_fused_kernels") is True
    entropy = "; with fused kernels (torch backend) the entropy arrives in bf16" if fused else ""
    return Finding("ok", "log-prob dtype", f"{text}, fine enough for the clip range {clip[0]:g}/{clip[1]:g}{entropy}")


def check_noise(ev: Evidence) -> Finding:
    """The on-policy ratio's numerical noise against the clip range."""
    clip = ev.clip_range()
    name = "on-policy noise"
    fix = "read it on a run with one update per step (ppo_mini_batch_size=train_batch_size, ppo_epochs=1)"
    one_update = ev.updates_per_step() == 1
    logged = [(name, level) for role, level in NOISE_LEVELS for name in METRICS[role] if ev.values_of(name)]
    usable = [(name, level) for name, level in logged if one_update or ON_POLICY_ONLY in name]
    kl, clipped = [abs(v) for v in ev.series("ppo_kl")], ev.series("clipfrac")
    verl_view = (f"; verl's view of these on-policy updates: |ppo_kl| max {max(kl):.1e}, clipped share max "
                 f"{max(clipped):.3g}" if one_update and kl and clipped else "")
    if usable:
        metric, level = usable[0]
        values = ev.values_of(metric)
        value, source = max(values), f"|{level} log-ratio| ({metric}), max over {len(values)} steps"
    elif one_update and ev.series("seq_ratio_max"):
        highs, lows = ev.series("seq_ratio_max"), ev.series("seq_ratio_min")
        value = max(max(math.log(h) for h in highs), max((-math.log(x) for x in lows if x > 0), default=0.0))
        level, source = "sequence", "max |log sequence ratio| of one-update steps (actor/tepo/seq_ratio_max/min)"
    elif one_update and ev.series("clipfrac"):
        share = max(ev.series("clipfrac"))
        if clip is None:
            return Finding("unknown", name, f"clipped share {share:.3g} on one-update steps; clip range unknown",
                           "pass --config")
        status = "ok" if share == 0 else "warn"
        return Finding(status, name, f"on-policy clipped share (every step has one update) max {share:.3g}: "
                       f"{'noise never crosses' if share == 0 else 'noise alone crosses'} the clip range "
                       f"{clip[0]:g}/{clip[1]:g}{verl_view}", "" if share == 0 else NOISE_FIX)
    else:
        updates = ev.updates_per_step()
        why = f"{updates} updates per step" if updates else "updates per step unknown"
        rollout = ev.series("rollout_probs_diff")
        context = (f"; rollout-vs-actor mean |dp| {_median(rollout):.2g} (vLLM against the actor, not this)"
                   if rollout else "")
        mixed = (f" ({', '.join(metric for metric, _ in logged)}: over all of a step's updates, so the off-policy "
                 "drift of the later ones, not noise)" if logged else "")
        return Finding("unknown", name, f"no metric of the on-policy update alone is logged and {why}: step metrics "
                       f"mix on- and off-policy updates{mixed}{context}", fix)
    if clip is None:
        return Finding("unknown", name, f"{source} = {value:.2e}; the clip range is unknown", "pass --config")
    share = value / min(clip)
    text = f"{source} = {value:.2e}, {share:.2g}x the clip range {clip[0]:g}/{clip[1]:g}{verl_view}"
    if share < NOISE_WARN:
        return Finding("ok", name, text)
    if level == "token":
        return Finding("warn", name, text + " (a token statistic; a sequence ratio averages it down)", NOISE_FIX)
    return Finding("FAIL" if share >= 1 else "warn", name, text, NOISE_FIX)


def _band(name: str, text: str, value: float, low: float, high: float, below: tuple[str, str],
          above: tuple[str, str]) -> Finding:
    """ok inside [low, high]; outside, a warning with the side's (verdict, fix)."""
    for outside, (verdict, fix) in ((value < low, below), (value > high, above)):
        if outside:
            return Finding("warn", name, f"{text}: {verdict}", fix)
    return Finding("ok", name, text)


def _tepo_values(ev: Evidence, name: str, role: str, what: str) -> list[float] | Finding:
    """A TEPO-only role's values, or the n/a / unknown finding when there are none to judge."""
    if not ev.is_tepo:
        return Finding("n/a", name, "not a TEPO run")
    if ev.mask_rule() == "off":
        return Finding("n/a", name, "mask_rule=off: the mask and its penalty are off (tepo_nomask)")
    values = ev.series(role)
    if not values:
        return Finding("unknown", name, f"{METRICS[role][0]} not logged",
                       f"update tepo-verl: newer versions log {what}")
    return values


#: The mask rules that select nearly every positive-advantage token by their own test, and why.
BROAD_BY_RULE = {"surprisal": "by design (-log p_max <= H)", "surprisal_old": "by design (-log p_max <= H)",
                 "always": "by definition"}


def check_mask(ev: Evidence) -> Finding:
    """A mask over nearly every positive-advantage token is a note for the rules that do that by their test (the
    float32 study's narrower controls did no differently: docs/algorithm.md), a warning for the others."""
    name = "TEPO mask"
    shares = _tepo_values(ev, name, "mask_frac_positive", "the mask's share of positive-advantage tokens")
    if isinstance(shares, Finding):
        return shares
    share = _median(shares)
    text = f"selects a median {share:.3g} of positive-advantage tokens (range {min(shares):.3g}-{max(shares):.3g})"
    rule = ev.mask_rule()
    if share > MASK_POSITIVE_HIGH and rule in BROAD_BY_RULE:
        return Finding("note", name, f"{text}: mask_rule={rule} selects nearly every positive token "
                       f"{BROAD_BY_RULE[rule]}; what a narrower selection does: "
                       "docs/algorithm.md#what-the-float32-study-says-about-the-masks-selection")
    return _band(name, text, share, MASK_POSITIVE_LOW, MASK_POSITIVE_HIGH,
                 ("the penalty almost never acts, TEPO is its policy term alone",
                  "check mask_rule and the old entropy (mask_rule=surprisal_old reads the stored one)"),
                 ("nearly every positive token is penalised",
                  "check mask_rule (with mask_rule=old and numerical noise the choice is near random)"))


def check_penalty(ev: Evidence) -> Finding:
    """A weak penalty is a note at or above the default kl_coef (what a stronger one does is in the docs), a warning
    below it."""
    name = "TEPO penalty strength"
    shares = _tepo_values(ev, name, "penalty_grad_share", "the penalty's share of the gradient on masked tokens")
    if isinstance(shares, Finding):
        return shares
    share = _median(shares)
    text = f"the penalty's share of the |gradient| on masked tokens: median {share:.3g}"
    kl_coef, default = ev.setting(KL_COEF), TepoOptions().kl_coef
    lowered = isinstance(kl_coef, int | float) and kl_coef < default
    if share < PENALTY_WEAK and not lowered:
        return Finding("note", name, f"{text}: weak, as it is at the default kl_coef {default:g}; before raising "
                       "it, read docs/algorithm.md#what-the-float32-study-says-about-kl_coef")
    return _band(name, text, share, PENALTY_WEAK, PENALTY_STRONG,
                 ("the penalty barely moves the update", f"raise {KL_COEF} (now {kl_coef}) toward the default "
                  f"{default:g}"),
                 ("the penalty outweighs the policy term where it acts", f"lower {KL_COEF}"))


def check_clip_binding(ev: Evidence) -> Finding:
    name = "clipped share"
    shares = ev.series("clipfrac")
    if not shares:
        return Finding("unknown", name, f"{CLIP_FRAC} not logged")
    mean = statistics.fmean(shares)
    text = f"mean {mean:.3g} of tokens clipped ({CLIP_FRAC}, {len(shares)} steps, max {max(shares):.3g})"
    if ev.updates_per_step() == 1:
        return Finding("note", name, text + "; one update per step, so every update is on-policy and the clip "
                       "can only act on noise")
    if mean > CLIP_BINDS_ALL:
        return Finding("warn", name, text + ": the clip binds most of the update",
                       "widen the clip range or lower the learning rate")
    if max(shares) == 0:
        return Finding("warn", name, text + ": the clip never binds", "narrow the clip range, or check that the "
                       "later mini-batches run (ppo_mini_batch_size < train_batch_size)")
    return Finding("ok", name, text)


def check_entropy(ev: Evidence) -> Finding:
    name = "entropy"
    values = ev.series("entropy")
    if len(values) < 2:
        return Finding("unknown", name, "fewer than two steps of entropy logged")
    k = max(1, min(3, len(values) // 4))
    start, end = _median(values[:k]), _median(values[-k:])
    ratio = end / start if start > 0 else 1.0
    text = f"{start:.3g} -> {end:.3g} ({ev.name_of('entropy')}, end/start {ratio:.2f} over {len(values)} steps)"
    fix = ("lower the learning rate, or for TEPO raise kl_coef; compare with a GRPO run on the same data (what the "
           "mask has been tested against: docs/algorithm.md#what-the-collapse-calibration-says-about-the-masks-scope)")
    if ratio < ENTROPY_COLLAPSE:
        return Finding("FAIL", name, text + ": collapsing", fix)
    if ratio < ENTROPY_FALLING:
        return Finding("warn", name, text + ": falling fast", fix)
    return Finding("ok", name, text)


def check_truncation(ev: Evidence) -> Finding:
    name = "response length"
    shares = ev.series("response_clip")
    if not shares:
        return Finding("unknown", name, "response_length/clip_ratio not logged")
    tail = shares[-max(1, len(shares) // 4):]
    share = statistics.fmean(tail)
    cap = ev.setting("data.max_response_length")
    text = (f"{share:.3g} of responses end at the length cap{f' ({cap})' if cap else ''} over the last "
            f"{len(tail)} steps (response_length/clip_ratio)")
    fix = "raise data.max_response_length (truncated answers are graded as written), or check the stop token"
    if share > TRUNCATED_FAIL:
        return Finding("FAIL", name, text, fix)
    if share > TRUNCATED_WARN:
        return Finding("warn", name, text, fix)
    return Finding("ok", name, text)


def check_signal(ev: Evidence) -> Finding:
    name = "learning signal"
    lows, highs = ev.series("score_min"), ev.series("score_max")
    if not lows or len(lows) != len(highs):
        return Finding("unknown", name, "critic/score/min and max not logged")
    if all(low == high for low, high in zip(lows, highs, strict=True)) and len(set(lows)) == 1:
        return Finding("FAIL", name, f"the reward is {lows[0]:g} on every response of every step: every group is "
                       "all-equal, every advantage 0", "check the reward function, the answer format and the data")
    adv = [(a, b) for a, b in zip(ev.series("adv_min"), ev.series("adv_max"), strict=False)]
    flat = sum(1 for a, b in adv if a == 0 and b == 0)
    if adv and flat:
        text = f"{flat} of {len(adv)} steps had every group all-equal (all advantages 0)"
        if flat / len(adv) > 0.25:
            return Finding("warn", name, text, "use harder or easier prompts, a larger rollout.n, or DAPO's "
                           "algorithm.filter_groups")
        return Finding("ok", name, text)
    evicted = ev.series("evicted")
    extra = f"; dynamic sampling evicted {sum(evicted):g} responses in all" if evicted else ""
    return Finding("ok", name, f"the reward varies ({min(lows):g} to {max(highs):g}){extra}")


def check_mask_rule(ev: Evidence) -> Finding:
    name = "mask rule"
    if not ev.is_tepo:
        return Finding("n/a", name, "not a TEPO run")
    rules = ev.logged_mask_rules()
    fallback = ev.series("mask_fallback")
    configured = ev.setting(MASK_RULE)
    if not rules:
        return Finding("unknown", name, "no actor/tepo/mask_rule/<name> metric logged")
    fell_back = sum(1 for f in fallback if f > 0)
    if fell_back:
        return Finding("FAIL", name, f"the configured rule{f' {configured}' if configured else ''} fell back "
                       f"(ran: {', '.join(rules)}) on {fell_back} of {len(fallback)} steps: its input, usually the "
                       "old entropy, was missing", "run through verl's main_ppo, whose trainers both hand the loss the "
                       "old entropy (docs/plugin.md), or set mask_rule to one whose inputs exist")
    if configured and rules != [configured]:
        return Finding("warn", name, f"configured {configured}, ran {', '.join(rules)}",
                       f"check {MASK_RULE}")
    return Finding("ok", name, f"ran {', '.join(rules)} on every step, no fallback")


CHECKS: list[Callable[[Evidence], Finding]] = [check_dtype, check_noise, check_mask, check_penalty,
                                              check_clip_binding, check_entropy, check_truncation, check_signal,
                                              check_mask_rule]


def diagnose(ev: Evidence) -> list[Finding]:
    findings = [check(ev) for check in CHECKS]
    if ev.truncated_last_line:
        findings.append(Finding("note", "metrics file", "its last line is half-written (a run still writing, or "
                                "killed) and was skipped"))
    return findings


def exit_code(findings: list[Finding], strict: bool = False) -> int:
    bad = {"FAIL", "warn"} if strict else {"FAIL"}
    return 1 if any(f.status in bad for f in findings) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tepo-verl doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (with metrics.jsonl or metrics.jsonl.gz) or a verl "
                        "file-logger .jsonl (or .jsonl.gz)")
    parser.add_argument("--config", type=Path, help="the composed config (.hydra/config.yaml or a --cfg job dump)")
    parser.add_argument("--console", type=Path, help="the run's console output (default: console.log beside it)")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    args = parser.parse_args(argv)
    try:
        for given, what in ((args.config, "config"), (args.console, "console")):
            if given is not None and not given.is_file():
                raise RunError(f"{what} file {given} does not exist")
        evidence = gather(args.run, args.config, args.console)
    except RunError as error:
        print(f"tepo-verl doctor: error: {error}", file=sys.stderr)
        return 2
    steps = sorted(evidence.metrics)
    print(f"tepo-verl doctor: {args.run} ({'TEPO' if evidence.is_tepo else 'not TEPO'}, steps {steps[0]}-{steps[-1]}; "
          f"config: {evidence.config_source or 'none'}; console: {'yes' if evidence.console is not None else 'none'})")
    findings = diagnose(evidence)
    for finding in findings:
        print(finding.line())
    code = exit_code(findings, args.strict)
    counts = {s: sum(f.status == s for f in findings) for s in ("FAIL", "warn")}
    print(f"{counts['FAIL']} failed, {counts['warn']} warnings (exit {code})")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
