"""The hand-written tables of docs/results.md and docs/algorithm.md agree with the generated comparison CSVs they quote.

The generated part of the page (between a study's markers) is checked by tests/test_study.py. The prose above it
quotes those numbers in tables of its own: the first study's headline (steps to target, paired differences, per-seed
differences, p), its ablation screen and its float32 pair; docs/algorithm.md quotes the float32 study's dose arms,
the evidence for its `kl_coef` default, its controls, the evidence for the mask's selection, and `tepo` against
`tepo_nomask` over 10 seeds, the mask's benefit; the float32 study's conclusion quotes every final comparison, and
README, results.md and cpu-mode.md what a run of it costs. Each cell is parsed from the page and compared with the
CSV value it quotes, to the precision the cell shows (a cell "0.742" matches 0.7421875, not 0.7431).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest
from study_module import load_study

from tepo_verl.report.runs import metrics_file, open_metrics

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "results.md"
ALGORITHM = REPO / "docs" / "algorithm.md"
COMPARE = REPO / "benchmarks" / "results" / "cpu-scratchpad" / "compare"


CHAIN_COMPARE = REPO / "benchmarks" / "results" / "cpu-chain" / "compare"
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def shown_as(text: str, value: float) -> bool:
    """Whether `value` rounds to the number written as `text` (to the decimals it shows)."""
    decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 0
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-12


def numbers(cell: str) -> list[str]:
    return NUMBER.findall(cell.replace("−", "-"))


def table_after(heading: str, page: Path = PAGE) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table after the line that starts with `heading`."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def csv(group: str, name: str) -> pd.DataFrame:
    return pd.read_csv(COMPARE / group / name)


def chain_paired(group: str) -> pd.DataFrame:
    """A float32-study comparison's paired differences, by (arm, metric)."""
    return pd.read_csv(CHAIN_COMPARE / group / "compare_paired.csv").set_index(["baseline", "metric"])


def chain_arms(group: str) -> pd.DataFrame:
    """A float32-study comparison's per-arm seed means, by arm."""
    return pd.read_csv(CHAIN_COMPARE / group / "compare.csv").set_index("algorithm")


def assert_cell(cell: str, *values: float) -> None:
    got = numbers(cell)
    assert len(got) == len(values) and all(shown_as(t, v) for t, v in zip(got, values)), (cell, values)


def test_the_shown_as_rule_can_fail():
    assert shown_as("0.742", 0.7421875) and not shown_as("0.742", 0.7431) and shown_as("-11", -11.4)
    assert not shown_as("10", 10.6) and shown_as("+5", 5.0) and not shown_as("0.0625", 0.0626)


def test_the_first_studys_headline_table():
    summary = csv("main", "compare.csv").set_index("algorithm")
    paired = csv("main", "compare_paired.csv").set_index(["baseline", "metric"])
    runs = csv("main", "compare_runs.csv").set_index(["algorithm", "seed"])
    rows = table_after("**Headline: steps to the 0.65 target**")
    assert [row[0].strip("`") for row in rows] == ["tepo", "grpo", "gspo", "dapo", "tepo_nomask"]
    for arm, steps, difference, per_seed, p in ((row[0].strip("`"), *row[1:]) for row in rows):
        s = summary.loc[arm]
        assert_cell(steps, s.steps_to_target, s.steps_to_target_ci_low, s.steps_to_target_ci_high)
        if arm == "tepo":
            assert difference == per_seed == p == ""
            continue
        d = paired.loc[(arm, "steps_to_target")]
        assert_cell(difference, d.mean_difference, d.ci_low, d.ci_high)
        assert_cell(p, d.p_value)
        assert_cell(per_seed, *[runs.loc[("tepo", k)].steps_to_target - runs.loc[(arm, k)].steps_to_target
                                for k in range(1, 6)])


ABLATION_ROWS = {
    "`tepo` (seeds 1, 2)": "tepo", "`mask_rule=surprisal`": "tepo-mask_surprisal", "`mask_rule=old`": "tepo-mask_old",
    "`kl_coef=0.1`": "tepo-kl0.1", "`kl_coef=10`": "tepo-kl10", "clip 3e-3/4e-3": "tepo-clip3e-3",
    "clip 3e-2/4e-2": "tepo-clip3e-2", "`gspo` (seeds 1, 2)": "gspo", "`gspo`, clip 3e-3/4e-3": "gspo-clip3e-3",
    "`gspo`, clip 3e-2/4e-2": "gspo-clip3e-2", "`tepo_nomask-seqmean`": "tepo_nomask-seqmean",
}


def test_the_first_studys_ablation_table():
    summary = csv("ablations", "compare.csv").set_index("algorithm")
    runs = csv("ablations", "compare_runs.csv").set_index(["algorithm", "seed"])
    rows = table_after("| arm | steps to target (seeds 1, 2)")
    assert [row[0] for row in rows] == list(ABLATION_ROWS)
    for label, steps, best, auc, clipped, masked in rows:
        arm = ABLATION_ROWS[label]
        for cell, column in ((steps, "steps_to_target"), (best, "best_val_acc"), (auc, "val_auc")):
            assert_cell(cell, *[runs.loc[(arm, seed)][column] for seed in (1, 2)])
        assert_cell(clipped.replace("(5 seeds)", ""), summary.loc[arm].clip_fraction)
        if masked:
            assert_cell(masked, summary.loc[arm].kl_mask_fraction)
        else:
            assert pd.isna(summary.loc[arm].kl_mask_fraction) or summary.loc[arm].kl_mask_fraction == 0, arm


def test_the_first_studys_float32_pair():
    summary = csv("precision", "compare.csv").set_index("algorithm")
    paired = csv("precision", "compare_paired.csv").set_index(["baseline", "metric"])
    rows = table_after("TEPO against GSPO at equal precision")
    columns = ["steps_to_target", "best_val_acc", "final_val_acc", "val_auc", "entropy_end"]
    for row in rows[:2]:
        s = summary.loc[row[0].strip("`")]
        assert_cell(row[1], s.steps_to_target, s.steps_to_target_ci_low, s.steps_to_target_ci_high)
        for cell, column in zip(row[2:], columns[1:]):
            assert_cell(cell, s[column])
    assert rows[2][0] == "`tepo-fp32` minus `gspo-fp32`, paired"
    for cell, column in zip(rows[2][1:], columns):
        d = paired.loc[("gspo-fp32", column)]
        with_interval = "[" in cell
        expected = (d.mean_difference, d.ci_low, d.ci_high, d.p_value) if with_interval else (d.mean_difference,
                                                                                               d.p_value)
        assert_cell(cell, *expected)


def test_the_first_studys_float32_per_seed_line():
    runs = csv("precision", "compare_runs.csv").set_index(["algorithm", "seed"])
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(r"Per seed \(1-5\), TEPO took ([\d, ]+) steps and GSPO ([\d, ]+): differences ([-+\d, ]+)\.",
                      text)
    assert found, "the float32 pair's per-seed line is missing"
    tepo = [runs.loc[("tepo-fp32", k)].steps_to_target for k in range(1, 6)]
    gspo = [runs.loc[("gspo-fp32", k)].steps_to_target for k in range(1, 6)]
    assert_cell(found.group(1), *tepo)
    assert_cell(found.group(2), *gspo)
    assert_cell(found.group(3), *[a - b for a, b in zip(tepo, gspo)])


def plans_call(d: pd.Series) -> str:
    """The plan's call on one comparison, from its rule: with 10 pairs "supported" when p < 0.05 and the interval
    excludes 0; with 5, "consistent" when every seed has the same sign (p at its floor, 2 / 2^5) and the interval
    excludes 0; otherwise "null"."""
    excludes_zero = d.ci_low > 0 or d.ci_high < 0
    if d.pairs == 10:
        return "supported" if d.p_value < 0.05 and excludes_zero else "null"
    assert d.pairs == 5, d.pairs  # the plan's two sizes: any other count is an unfinished comparison
    every_seed_agrees = d.p_value == pytest.approx(2.0 ** (1 - d.pairs))
    return "consistent" if every_seed_agrees and excludes_zero else "null"


def assert_quoted_call(cells: list[str], d: pd.Series) -> str:
    """A row quoting one final comparison of the float32 study: its numbers, and the call the plan's rule gives."""
    mean, interval, p, call = cells
    assert_cell(mean, d.mean_difference)
    assert_cell(interval, d.ci_low, d.ci_high)
    assert_cell(p, d.p_value)
    expected = plans_call(d)
    assert call.startswith(expected), (call, expected)
    return expected


def assert_plan_call(cells: list[str], d: pd.Series) -> None:
    """A row quoting one final 5-seed comparison behind a default.

    The rule changes a default only for an arm that beats `tepo` on every paired seed with an interval that
    excludes 0, so a row whose arm did is a failure here: the docs would be keeping a default the rule replaces.
    """
    assert d.pairs == 5  # the plan's 5 seeds: the decision is final
    call = assert_quoted_call(cells, d)
    assert not (d.mean_difference < 0 and call == "consistent"), "an arm beat tepo: the default changes"


@pytest.mark.parametrize("pairs, mean, low, high, p, call", [
    (10, 0.01, 0.002, 0.02, 0.04, "supported"), (10, 0.01, 0.002, 0.02, 0.06, "null"),
    (10, -0.01, -0.02, 0.001, 0.04, "null"), (5, 0.01, 0.002, 0.02, 0.0625, "consistent"),
    (5, 0.01, 0.002, 0.02, 0.125, "null"), (5, -0.01, -0.02, -0.002, 0.0625, "consistent")])
def test_plans_call_follows_the_plans_rule(pairs, mean, low, high, p, call):
    d = pd.Series({"pairs": pairs, "mean_difference": mean, "ci_low": low, "ci_high": high, "p_value": p})
    assert plans_call(d) == call


def test_the_kl_coef_default_quotes_the_float32_dose_arms():
    paired = chain_paired("dose")
    rows = table_after("### What the float32 study says about `kl_coef`", ALGORITHM)
    assert [row[0].strip("`") for row in rows] == ["tepo-kl10", "tepo-kl100"]
    for arm, *cells in rows:
        assert_plan_call(cells, paired.loc[(arm.strip("`"), "val_auc")])
    text = ALGORITHM.read_text(encoding="utf-8")
    # the prose's claims on kl 100, against tepo on the same seeds 1-5 (tepo has more seeds than the dose arms)
    runs = pd.read_csv(CHAIN_COMPARE / "dose" / "compare_runs.csv")
    kl100 = runs[runs.algorithm == "tepo-kl100"]
    tepo = runs[(runs.algorithm == "tepo") & runs.seed.isin(kl100.seed)]
    assert len(kl100) == len(tepo) == 5
    assert (f"({kl100.entropy_end.mean():.3f} nats per token at step 80\nagainst `tepo`'s "
            f"{tepo.entropy_end.mean():.3f})") in text
    assert f"{kl100.reached.sum()} of 5 seeds reached the target accuracy, against {tepo.reached.sum()} of 5" in text
    assert "**`kl_coef` stays 1**" in text and "| `kl_coef` | `1.0` |" in text  # the rule's outcome, as configured


def test_the_mask_selection_default_quotes_the_float32_controls():
    paired = chain_paired("control")
    arms = chain_arms("control")
    rows = table_after("### What the float32 study says about the mask's selection", ALGORITHM)
    assert [row[0].split()[0].strip("`") for row in rows] == ["ctl-positive", "ctl-top20", "ctl-every"]
    for control, *cells, share, strength in rows:
        arm = control.split()[0].strip("`")
        assert_plan_call(cells, paired.loc[(arm, "val_auc")])
        assert arms.loc[arm, "seeds"] == 5
        assert_cell(share, arms.loc[arm, "mask_share_positive"])
        assert_cell(strength, arms.loc[arm, "penalty_strength"])
    text = ALGORITHM.read_text(encoding="utf-8")
    # the prose's claims: top-20's penalty is several times tepo's; every-token kept the entropy up, few reached
    assert arms.loc["ctl-top20", "penalty_strength"] > 3 * arms.loc["tepo", "penalty_strength"]
    assert f"({arms.loc['ctl-every', 'entropy_end']:.3f} nats per token at step 80)" in text
    assert arms.loc["ctl-every", "entropy_end_ci_low"] > arms.loc["tepo", "entropy_end_ci_high"]
    assert f"{arms.loc['ctl-every', 'reached']} of 5 seeds reached" in text
    # the rule's outcome, as configured
    assert "**the selection stays\n`surprisal_old` on positive-advantage tokens" in text
    assert "| `mask_rule` | `surprisal_old` |" in text and "| `mask_top_frac` | `1.0` |" in text


SECONDARY_ROWS = {"final validation accuracy": "final_val_acc", "best validation accuracy": "best_val_acc",
                  "token-mean entropy at step 80 (nats)": "entropy_end",
                  "steps to the target accuracy": "steps_to_target"}


def test_the_masks_benefit_quotes_tepo_against_tepo_nomask_over_10_seeds():
    paired = chain_paired("main")
    runs = pd.read_csv(CHAIN_COMPARE / "main" / "compare_runs.csv").set_index(["algorithm", "seed"])
    arms = chain_arms("main")
    heading = "### What the float32 study says about the mask's benefit"
    rows = table_after(heading, ALGORITHM)
    assert [row[0] for row in rows] == ["`tepo_nomask`"]
    d = paired.loc[("tepo_nomask", "val_auc")]
    assert d.pairs == 10  # the plan's 10 seeds: the call is final
    call = assert_quoted_call(rows[0][1:], d)
    text = ALGORITHM.read_text(encoding="utf-8")
    section = text[text.index(heading):text.index("## Metrics (each step")]
    # the call in words, as the plan asks for a null: not established, with its interval; the defaults stay
    if call == "null":
        assert "It is a null: **the mask's benefit is not established on this test bed.**" in section
    else:
        assert f"It is {call}" in section
    positive = sum(runs.loc[("tepo", k)].val_auc > runs.loc[("tepo_nomask", k)].val_auc for k in range(1, 11))
    assert f"`tepo`'s curve area was the higher on {positive} of 10 seeds" in section
    share = d.ci_high / arms.loc["tepo", "val_auc"]
    assert (f"upper end, {d.ci_high:+.4f}, is {share:.0%} of\n`tepo`'s seed-mean area "
            f"({arms.loc['tepo', 'val_auc']:.3f})") in section
    secondary = table_after("| metric | `tepo` minus `tepo_nomask`", ALGORITHM)
    assert [row[0] for row in secondary] == list(SECONDARY_ROWS)
    for label, mean, interval, p in secondary:
        s = paired.loc[("tepo_nomask", SECONDARY_ROWS[label])]
        assert s.pairs == 10
        assert_cell(mean, s.mean_difference)
        assert_cell(interval, s.ci_low, s.ci_high)
        assert_cell(p, s.p_value)
        assert s.p_value >= 0.05 or (s.ci_low <= 0 <= s.ci_high), label  # "show nothing either"
    strength = arms.loc["tepo", "penalty_strength"]
    assert f"the penalty's gradient is {strength:.1%} of the policy term's" in section
    assert f"seed\nmean {strength:.4f} over the steps where it was finite)" in section
    assert "| `mask_rule` | `surprisal_old` |" in text and "| `kl_coef` | `1.0` |" in text  # the defaults stay


def test_the_readme_and_the_results_page_quote_the_two_primary_comparisons():
    paired = chain_paired("main")
    runs = pd.read_csv(CHAIN_COMPARE / "main" / "compare_runs.csv").set_index(["algorithm", "seed"])
    texts = {page.name: " ".join(page.read_text(encoding="utf-8").split()) for page in (REPO / "README.md", PAGE)}
    for arm in ("tepo_nomask", "gspo"):
        d = paired.loc[(arm, "val_auc")]
        assert d.pairs == 10 and plans_call(d) == "null"  # what the prose says of both
        quoted = f"{d.mean_difference:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}], p = {d.p_value:.3g}"
        for name, text in texts.items():
            assert quoted in text, (name, arm, quoted)
    assert "`tepo` minus `tepo_nomask` on the validation curve's area" in texts["README.md"]
    assert "**TEPO's mask is not shown to help.**" in texts["README.md"]
    assert "Against GSPO, the other primary comparison, TEPO is not shown to differ" in texts["README.md"]
    baselines = [paired.loc[(arm, "val_auc")] for arm in ("grpo", "dapo")]
    assert all(d.pairs == 10 and plans_call(d) == "supported" and d.mean_difference < 0 for d in baselines)
    assert ("GRPO and DAPO, secondary comparisons, learned faster than TEPO on this test bed: " + ", and ".join(
        f"{d.mean_difference:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}], p = {d.p_value:.3g}" for d in baselines)
        ) in texts["README.md"]
    # beside that lead, the clip band's caveat, with the arms' clip fractions as the summary table has them
    summary = chain_arms("main")
    sequence, token = summary.loc[["tepo", "tepo_nomask", "gspo"]], summary.loc[["grpo", "dapo"]]
    assert 0.2 < sequence.clip_fraction.min() and sequence.clip_fraction.max() < 0.3
    assert token.clip_fraction.max() < 0.01
    assert ("TEPO and GSPO ran at GSPO's 3e-4/4e-4 band, which clipped about a quarter of their tokens (GRPO and "
            "DAPO: under 1%), so the study cannot tell whether the sequence ratio or its clip band held them back. "
            "A second pre-registered study widened that band") in texts["README.md"]
    section = conclusion()
    for arm in ("tepo_nomask", "gspo"):
        higher = sum(runs.loc[("tepo", k)].val_auc > runs.loc[(arm, k)].val_auc for k in range(1, 11))
        assert f"`tepo` was higher on {higher} of 10 seeds against `{arm}`" in section


STUDY_ARMS = {"main": ("tepo_nomask", "gspo", "grpo", "dapo"), "dose": ("tepo-kl10", "tepo-kl100"),
              "control": ("ctl-positive", "ctl-top20", "ctl-every")}


def conclusion() -> str:
    """The float32 study's conclusion in results.md, whitespace normalised."""
    text = PAGE.read_text(encoding="utf-8")
    return " ".join(text[text.index("#### Conclusion"):text.index("#### The study's tables and plots")].split())


def responses_per_step(arm: str) -> list[float]:
    """Each committed run's mean number of responses generated for training a step (DAPO's regenerations included)."""
    key = "tepo_verl/responses_generated"
    per_run = []
    for folder in sorted(CHAIN_COMPARE.parent.glob(f"{arm}-seed*/")):
        with open_metrics(metrics_file(folder)) as handle:
            steps = [json.loads(line)["data"] for line in handle]
        per_run.append(statistics.mean(step[key] for step in steps if key in step))
    return per_run


def test_the_studys_conclusion_quotes_every_final_comparison_with_the_plans_call():
    section = conclusion()
    paired = {group: chain_paired(group) for group in STUDY_ARMS}
    for group, arms in STUDY_ARMS.items():
        for arm in arms:
            d = paired[group].loc[(arm, "val_auc")]
            assert d.pairs == (10 if group == "main" else 5), arm  # every comparison has its planned pairs
            quoted = (f"(`tepo` minus `{arm}`: {d.mean_difference:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}], "
                      f"p = {d.p_value:.3g}, {plans_call(d)})")
            assert quoted in section, quoted
    main, arms = paired["main"], chain_arms("main")
    # the headlines' words follow from the calls and their signs
    assert all(plans_call(main.loc[(arm, "val_auc")]) == "null" for arm in ("tepo_nomask", "gspo"))
    assert "**The mask's benefit is not established**" in section
    assert "**TEPO is not shown to differ from GSPO**" in section
    baselines = [main.loc[(arm, "val_auc")] for arm in ("grpo", "dapo")]
    assert all(plans_call(d) == "supported" and d.mean_difference < 0 for d in baselines)
    assert "**GRPO and DAPO learned faster than TEPO here**" in section
    # the three sequence-ratio arms all sit below the two token-ratio arms, and clip far more of their tokens
    sequence, token = arms.loc[["tepo", "tepo_nomask", "gspo"]], arms.loc[["grpo", "dapo"]]
    assert sequence.val_auc.max() < token.val_auc.min()
    assert (f"`clip_fraction` {sequence.clip_fraction.min():.3f}-{sequence.clip_fraction.max():.3f}, against "
            f"{token.clip_fraction.min():.3f}-{token.clip_fraction.max():.3f}") in section
    # DAPO's regenerations: more responses a step than the others' fixed 32 x 8, and per response not faster
    assert all(responses_per_step(arm) == [256] * 10 for arm in ("tepo", "tepo_nomask", "gspo", "grpo"))
    dapo = responses_per_step("dapo")
    assert len(dapo) == 10
    assert f"a DAPO step used {statistics.mean(dapo):.0f} responses on average against the others' 256" in section
    rollouts = main.loc[("dapo", "rollouts_to_target")]
    assert rollouts.p_value >= 0.05 and rollouts.ci_low <= 0 <= rollouts.ci_high  # "about as many"
    strength = arms.loc["tepo", "penalty_strength"]
    assert f"the penalty's gradient on the tokens it selects is about {strength:.0%}" in section


def test_the_quoted_run_cost_is_the_committed_float32_runs_wall_time():
    """README, results.md and cpu-mode.md quote what a run of the study costs: the range and the median of the
    committed runs' `wall_s`, in whole minutes."""
    chain = load_study()
    planned = {run.name for run in chain.plan([*chain.CHAIN.arms, *chain.CONTROL_TEMPLATES], None, chain.CHAIN)}
    walls = [json.loads((CHAIN_COMPARE.parent / name / "run.json").read_text())["wall_s"] / 60 for name in planned]
    assert len(walls) == 75  # every planned run, not the clip band's beside them in the same folder
    low, high, median = round(min(walls)), round(max(walls)), round(statistics.median(walls))
    texts = {page: " ".join(page.read_text(encoding="utf-8").split())
             for page in (REPO / "README.md", PAGE, REPO / "docs" / "cpu-mode.md")}
    for page, text in texts.items():
        assert f"{low}-{high} minutes" in text and f", {median} the median" in text, (page.name, low, high, median)
    assert f"a run of this regime costs about {median} minutes" in texts[PAGE]
    assert f"the 75 runs took about {sum(walls) / 60:.0f} hours in all" in texts[PAGE]


@pytest.mark.parametrize("cell, values, ok", [("10 [7, 13]", (10, 7, 13), True), ("10 [7, 13]", (10, 7, 14), False),
                                              ("-0.031 [-0.045, -0.016], p = 0.0625", (-0.031, -0.045, -0.016, 0.0625),
                                               True)])
def test_assert_cell_fails_on_a_wrong_number(cell, values, ok):
    if ok:
        assert_cell(cell, *values)
    else:
        with pytest.raises(AssertionError):
            assert_cell(cell, *values)


def clip_band_calls() -> tuple[dict[tuple[str, str], object], object]:
    """The clip band plan's calls as the committed runs give them, by (reference, arm), and the study module."""
    study = load_study()
    values = {study.PRIMARY: study.per_seed(CHAIN_COMPARE / "clipband")}
    return {(c.contrast.reference, c.contrast.arm): c for c in study.contrast_calls(values, study.CLIPBAND)}, study


def test_the_clip_band_calls_are_quoted_where_the_plan_says():
    """The plan: the documentation of the tepo, tepo_nomask and gspo presets quotes the decision lines with their
    intervals; the README's summary and the page's conclusion carry them too."""
    calls, study = clip_band_calls()
    assert all(call.word != "pending" for call in calls.values())
    widening = [calls[("tepo-clip3e-2", "tepo")], calls[("gspo-clip3e-2", "gspo")]]
    assert all(call.word == "supported" and call.mean < 0 for call in widening)  # what every quote says: it hurt
    texts = {path.name: " ".join(path.read_text(encoding="utf-8").split())
             for path in (REPO / "README.md", ALGORITHM, REPO / "docs" / "presets.md", PAGE)}
    for name, text in texts.items():
        for call in widening:
            assert study.contrast_text(call) in text, (name, study.contrast_text(call))
    section = texts["algorithm.md"].split("### What the clip band study says about the clip range")[1]
    for pair in (("grpo", "tepo-clip3e-2"), ("grpo", "gspo-clip3e-2"), ("tepo-clip3e-2", "gspo-clip3e-2")):
        assert study.contrast_text(calls[pair]) in section, pair
    fractions = study.clip_fractions(CHAIN_COMPARE / "clipband", ["tepo-clip3e-2", "gspo-clip3e-2"])
    assert (f"seed-mean clip fraction {fractions['tepo-clip3e-2']:.3f} for `tepo`, "
            f"{fractions['gspo-clip3e-2']:.3f} for `gspo`") in section


def test_the_collapse_calibration_is_quoted_where_the_plan_says():
    """The calibration is over without a level (its procedure on the committed runs), and the page's conclusion,
    docs/algorithm.md and the README say so, each level quoted with its run's entropy and validation accuracy."""
    study = load_study()
    results = REPO / "benchmarks" / "results" / study.COLLAPSE.results_name
    next_run, checks, state = study.collapse_state(results, int(study.COLLAPSE.regime["STEPS"]))
    assert next_run is None and state.startswith("not reached") and not any(check.met for check in checks)
    texts = {path.name: " ".join(path.read_text(encoding="utf-8").split()) for path in (PAGE, ALGORITHM)}
    sections = {"results.md": texts["results.md"].split("### What the calibration found")[1].split("## ")[0],
                "algorithm.md": texts["algorithm.md"].split(
                    "### What the collapse calibration says about the mask's scope")[1].split("## ")[0]}
    assert len(checks) == len(study.COLLAPSE_LEVELS)  # each level missed on its first arm
    for level, check in zip(study.COLLAPSE_LEVELS, checks):
        assert check.run == f"{level.name}-{study.COLLAPSE_ARMS[0]}-seed{study.COLLAPSE_SEED}"
        learned = check.val_best - check.val_start >= study.RISE_MIN
        for name, section in sections.items():
            bullet = section.split(f"- `{level.name}`")[1].split("- `")[0]
            assert f"entropy {check.entropy_first:.3f} -> {check.entropy_last:.3f}" in bullet, (name, level.name)
            assert (f"validation accuracy {check.val_start:.3f} before training, best {check.val_best:.3f}"
                    in bullet), (name, level.name)
            assert ("never learned" in bullet) is not learned, (name, level.name)
    assert "the mask has not been tested against the failure it was designed for" in sections["algorithm.md"]
    assert "the mask was not tested against a collapse here" in " ".join(
        (REPO / "README.md").read_text(encoding="utf-8").split())
