"""benchmarks/chain_by_operands.py: the chain task's validation accuracy by operand count, from verl's generations."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("chain_by_operands", REPO / "benchmarks" / "chain_by_operands.py")
by_operands = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(by_operands)


def _generations(run_dir: Path, step: int, items: list[tuple[str, float]]) -> None:
    """verl's validation dump: one JSON line per problem with the chat-templated input and its acc."""
    folder = run_dir / "val_generations"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"input": f"user\nWhat is {question}?\nassistant\n", "output": "", "acc": acc, "step": step})
             for question, acc in items]
    (folder / f"{step}.jsonl").write_text("\n".join(lines) + "\n")


def test_accuracy_by_operand_count_at_every_validation_step_in_step_order(tmp_path, capsys):
    _generations(tmp_path, 12, [("10+11+12", 0.0), ("10+11+12+13", 1.0)])
    _generations(tmp_path, 4, [("10+11+12", 1.0), ("13+14+15", 0.0), ("10+11+12+13", 1.0), ("1+2+3+4+5", 0.0)])
    assert by_operands.main([str(tmp_path)]) == 0
    with (tmp_path / "validation_by_operands.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["step"] for row in rows] == ["4", "12"]  # numeric order, not the files' names
    first, second = rows
    assert (first["all"], first["operands_3"], first["n_3"], first["operands_4"], first["operands_5"]) == (
        "0.5", "0.5", "2", "1.0", "0.0")
    assert (second["all"], second["operands_3"], second["operands_4"], second["operands_5"]) == (
        "0.5", "0.0", "1.0", "")
    assert "   4  0.500  0.500  1.000  0.000" in capsys.readouterr().out


def test_a_run_without_generations_or_a_foreign_prompt_says_so(tmp_path, capsys):
    assert by_operands.main([str(tmp_path)]) == 2
    assert "no validation generations (<step>.jsonl) in" in capsys.readouterr().err
    _generations(tmp_path, 0, [("10+11", 1.0)])
    (tmp_path / "val_generations" / "0.jsonl").write_text(json.dumps({"input": "What is 2 times 3?", "acc": 1.0}))
    assert by_operands.main([str(tmp_path)]) == 2
    assert "not a chain-task prompt: 'What is 2 times 3?'" in capsys.readouterr().err
