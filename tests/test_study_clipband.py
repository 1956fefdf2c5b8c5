"""The clip band's plan as code (benchmarks/study.py, CLIPBAND): its arms, Holm's rule over its contrasts, the calls
and the decision rule it pre-registered in docs/results.md, on synthetic per-seed values and on the committed runs."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from study_module import load_study

REPO = Path(__file__).resolve().parents[1]
study = load_study()
CLIPBAND = study.CLIPBAND
SEEDS = range(1, 11)


# ---- Holm's rule -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p_values, expected", [
    ([0.002, 0.004, 0.006, 0.02, 0.04], [True] * 5),  # 0.002<=.01, .004<=.0125, .006<=.0167, .02<=.025, .04<=.05
    ([0.002, 0.004, 0.02, 0.02, 0.04], [True, True, False, False, False]),  # .02 > .0167 stops the walk
    ([0.011, 0.002, 0.9, 0.004, 0.3], [True, True, False, True, False]),  # order of the list is not the walk's
    ([0.0105, 0.002, 0.002, 0.002, 0.002], [True] * 5),  # the largest needs only <= 0.05
    ([0.02, 0.02, 0.02, 0.02, 0.02], [False] * 5),  # the smallest must pass 0.01 first
    ([math.nan, 0.001, 0.001, 0.001, 0.001], [False, True, True, True, True]),  # NaN is never rejected
])
def test_holm_by_hand(p_values, expected):
    assert study.holm_rejections(p_values) == expected


@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_holm_lies_between_bonferroni_and_no_correction(p_values):
    """Holm rejects every hypothesis Bonferroni rejects, and none that is not significant on its own."""
    rejected = study.holm_rejections(p_values)
    m = len(p_values)
    for p, r in zip(p_values, rejected, strict=True):
        if p <= study.CONTRAST_ALPHA / m:
            assert r
        if p > study.CONTRAST_ALPHA:
            assert not r
    # step-down: a rejected p is never larger than a kept one
    assert all(p <= q for (p, r), (q, k) in itertools.product(zip(p_values, rejected), repeat=2) if r and not k)


# ---- calls and decisions on synthetic per-seed values ----------------------------------------------------------------

def values(**means: float) -> dict[str, dict[int, float]]:
    """arm -> seed -> val_auc: each arm's mean, a seed effect shared by every arm (pairing cancels it) and the arm's
    own noise (sd 0.002, seeded by the arm's name)."""
    shared = {seed: 0.01 * math.sin(seed) for seed in SEEDS}
    return {arm: {seed: mean + shared[seed] + noise.gauss(0, 0.002) for seed in SEEDS}
            for arm, mean in means.items() for noise in [random.Random(arm)]}


def calls_of(v):
    return {(c.contrast.reference, c.contrast.arm): c for c in study.contrast_calls({study.PRIMARY: v}, CLIPBAND)}


def test_a_contrast_is_pending_until_every_contrast_has_its_ten_pairs():
    v = values(tepo=0.25, gspo=0.25, grpo=0.27, **{"tepo-clip3e-2": 0.27, "gspo-clip3e-2": 0.27})
    del v["gspo-clip3e-2"][10]
    calls = calls_of(v)
    assert {call.word for call in calls.values()} == {"pending"}
    assert len(calls[("tepo-clip3e-2", "tepo")].differences) == 10
    assert study.clip_band_decisions(list(calls.values()), v, {})[0].startswith("- **Pending**: 9 of 10")


def test_calls_follow_the_sign_flip_p_holm_and_the_interval():
    """A difference of +0.02 on every seed is supported (p = 2/1024); no difference at all is a null."""
    v = values(tepo=0.25, gspo=0.25, grpo=0.27, **{"tepo-clip3e-2": 0.27, "gspo-clip3e-2": 0.25})
    calls = calls_of(v)
    widen_tepo, widen_gspo = calls[("tepo-clip3e-2", "tepo")], calls[("gspo-clip3e-2", "gspo")]
    assert all(d > 0.01 for d in widen_tepo.differences)
    assert widen_tepo.p == pytest.approx(2 / 1024) and widen_tepo.holm and widen_tepo.word == "supported"
    assert widen_tepo.ahead == "tepo-clip3e-2"
    assert abs(widen_gspo.mean) < 0.005 and widen_gspo.word == "null" and widen_gspo.ahead == "-"


@pytest.mark.parametrize("wide_tepo, expected", [
    (0.27, "The band explains GRPO's lead over `tepo`"),  # widening +0.02, GRPO's lead gone
    (0.26, "Widening the band helps `tepo`, and GRPO's lead is not explained by it alone"),  # +0.01, lead +0.01
    (0.23, "Widening the band hurts `tepo`"),
    (0.25, "Widening the band is not shown to help `tepo`"),
])
def test_the_decision_rule(wide_tepo, expected):
    v = values(tepo=0.25, gspo=0.25, grpo=0.27, **{"tepo-clip3e-2": wide_tepo, "gspo-clip3e-2": 0.25})
    lines = study.clip_band_decisions(study.contrast_calls({study.PRIMARY: v}, CLIPBAND), v, {"tepo-clip3e-2": 0.01})
    tepo_line = next(line for line in lines if "`tepo`" in line and "at 3e-4" in line)
    assert tepo_line.startswith(f"- **{expected}**") and "(the wide band unbound it)" in tepo_line, tepo_line
    gap = sum(v["grpo"][s] - v["tepo"][s] for s in SEEDS) / 10
    assert f"today's gap of {gap:+.4f}" in tepo_line and f"half of it {gap / 2:+.4f}" in tepo_line
    gspo_line = next(line for line in lines if "`gspo` at 3e-4" in line)
    assert "did not unbind it (clip fraction nan" in gspo_line  # no fraction given: not taken as unbound


def test_a_remaining_lead_below_half_the_gap_still_needs_its_interval_below_it():
    """The rule reads the interval's upper bound, not the mean: a remaining lead whose mean is below half of the gap
    but whose interval reaches above it does not let the band explain the lead."""
    v = values(tepo=0.25, gspo=0.25, grpo=0.27, **{"tepo-clip3e-2": 0.262, "gspo-clip3e-2": 0.25})
    v["grpo"] = {s: x + (0.03 if s <= 3 else -0.01) for s, x in v["grpo"].items()}  # a lead of uneven size
    calls = calls_of(v)
    lead, widening = calls[("grpo", "tepo-clip3e-2")], calls[("tepo-clip3e-2", "tepo")]
    gap = sum(v["grpo"][s] - v["tepo"][s] for s in SEEDS) / 10
    assert widening.word == "supported" and lead.word == "null" and lead.mean < gap / 2 <= lead.high
    lines = study.clip_band_decisions(list(calls.values()), v, {})
    assert any(line.startswith("- **Widening the band helps `tepo`, and GRPO's lead is not explained by it alone**")
               for line in lines)


# ---- the plan as committed ---------------------------------------------------------------------------------------

def test_the_arms_are_the_presets_at_the_wide_band_in_the_float32_regime():
    assert CLIPBAND.regime == study.CHAIN.regime and CLIPBAND.common_overrides == study.CHAIN.common_overrides
    assert CLIPBAND.results_name == study.CHAIN.name and CLIPBAND.target == study.CHAIN.target
    assert {arm.name: (arm.preset, arm.overrides) for arm in CLIPBAND.arms} == {
        f"{preset}-clip3e-2": (preset, ("actor_rollout_ref.actor.clip_ratio=0.03",
                                        "actor_rollout_ref.actor.clip_ratio_low=0.03",
                                        "actor_rollout_ref.actor.clip_ratio_high=0.04"))
        for preset in ("tepo", "gspo")}
    assert CLIPBAND.seeds == {"clipband": tuple(SEEDS)}
    runs = study.plan(list(CLIPBAND.arms), None, CLIPBAND)  # seed-major: both arms of a seed, then the next
    assert [(r.arm.name, r.seed) for r in runs[:4]] == [("tepo-clip3e-2", 1), ("gspo-clip3e-2", 1),
                                                         ("tepo-clip3e-2", 2), ("gspo-clip3e-2", 2)]


def test_the_page_states_the_plan_the_code_applies():
    """The plan on docs/results.md names the five contrasts in the code's order, Holm's thresholds, the unbinding
    level and today's gaps as the committed float32 runs give them."""
    page = " ".join((REPO / "docs" / "results.md").read_text(encoding="utf-8").split())
    plan = page.split("## The clip band:")[1].split("### Results")[0]
    for k, contrast in enumerate(CLIPBAND.contrasts, 1):
        assert f"{k}. `{contrast.reference}` minus `{contrast.arm}`: {contrast.question}" in plan
    m = len(CLIPBAND.contrasts)
    thresholds = [study.CONTRAST_ALPHA / (m - k) for k in range(m)]
    assert ("the smallest p must be at most 0.01, the next 0.0125, then 0.0167, 0.025 and 0.05"
            in plan) and [f"{t:.3g}" for t in thresholds] == ["0.01", "0.0125", "0.0167", "0.025", "0.05"]
    assert f"below {study.UNBOUND_CLIP_FRACTION}" in plan
    committed = study.per_seed(REPO / "benchmarks" / "results" / "cpu-chain" / "compare" / "main")
    for arm in ("tepo", "gspo"):
        gap = sum(committed["grpo"][s] - committed[arm][s] for s in SEEDS) / 10
        assert f"{gap:+.4f} for `{arm}`" in plan
