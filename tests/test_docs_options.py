"""The README's options table and the mask-rule table in docs/algorithm.md say what the code does."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tepo_verl.core import MASK_RULES, TepoOptions
from tepo_verl.core.options import CHOICES
from tepo_verl.verl_adapter.registry import ON_POLICY_METRICS, TEPO_METRICS

REPO = Path(__file__).resolve().parents[1]


def _table_after(text: str, heading: str) -> list[list[str]]:
    """Rows (cells stripped of backticks) of the first markdown table after `heading`."""
    section = text[text.index(heading + "\n"):]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # drop the header row and the --- row


def test_readme_options_table_matches_tepo_options():
    rows = {row[0]: row for row in _table_after((REPO / "README.md").read_text(), "## Options")}
    defaults = TepoOptions()
    assert list(rows) == list(TepoOptions.field_names())
    for field in dataclasses.fields(TepoOptions):
        _, default, values, _ = rows[field.name][:4]
        assert default == str(getattr(defaults, field.name)), field.name
        if field.name in CHOICES:
            listed = re.split(r"[,/ ]+", values.strip())
            assert sorted(listed) == sorted(CHOICES[field.name]), field.name


def test_mask_rule_table_in_the_docs_matches_the_code():
    rows = {row[0]: row for row in _table_after((REPO / "docs/algorithm.md").read_text(), "### Mask rules")}
    assert list(rows) == list(MASK_RULES)
    for name, rule in MASK_RULES.items():
        assert rows[name][1] == rule.test, name


def test_metrics_table_in_the_docs_lists_the_logged_tepo_metrics():
    rows = _table_after((REPO / "docs/algorithm.md").read_text(), "## Metrics (each step, under `actor/tepo/`)")
    assert [row[0] for row in rows] == [*TEPO_METRICS, *(f"onpolicy_{name}" for name in ON_POLICY_METRICS)]


def _metric_names(cell: str) -> list[str]:
    """'tepo/seq_ratio_mean, _min, _max' -> the three full names (a short form replaces as many trailing parts)."""
    names = []
    for item in (part.strip() for part in cell.split(",")):
        if item.startswith("_"):
            base = names[-1].split("_")
            names.append("_".join(base[: len(base) - item.count("_")]) + item)
        else:
            names.append(item)
    return names


def test_the_metrics_table_lists_every_logged_tepo_metric():
    heading = "## Metrics (verl's normal metric path, each step, under `actor/`)"
    rows = _table_after((REPO / "docs" / "plugin.md").read_text(), heading)
    listed = {name for row in rows for name in _metric_names(row[0]) if name.startswith("tepo/")}
    assert {f"tepo/{name}" for name in TEPO_METRICS} <= listed
