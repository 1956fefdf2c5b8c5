"""tepo_verl.data: offline conversion of the shipped evaluation sets, verl's schema, RLHFDataset loading,
field extraction for each hub format, drop/duplicate accounting, contamination, CLI errors."""

from __future__ import annotations

import json
import string
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_data  # noqa: E402

from tepo_verl.data import main  # noqa: E402
from tepo_verl.data.contamination import normalize_question  # noqa: E402
from tepo_verl.data.convert import convert_records  # noqa: E402
from tepo_verl.data.registry import DATASETS, GROUPS, get_spec  # noqa: E402
from tepo_verl.data.schema import EXTRA_INFO_FIELDS  # noqa: E402
from tepo_verl.data.sources import load_hub  # noqa: E402
from tepo_verl.data.templates import DAPO_PREFIX, DAPO_SUFFIX, QWEN_MATH_INSTRUCTION, TEMPLATES, get_template  # noqa: E402

OFFLINE_NAMES = {  # registry name -> shipped file stem
    "aime24": "aime24", "aime25": "aime25", "amc23": "amc23", "math500": "math500", "minerva": "minerva",
    "olympiadbench": "olympiadbench", "gsm8k_test": "gsm8k_test",
}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def offline_out(tmp_path_factory):
    """All shipped evaluation sets converted once, offline, with the default template."""
    source = conftest_data.math_eval_dir()
    out = tmp_path_factory.mktemp("converted")
    argv = ["convert", "eval", "gsm8k_test", "--local-dir", str(source), "--offline", "--out-dir", str(out),
            "--combine-eval", str(out / "val.parquet"), "--no-progress"]
    assert main(argv) == 0
    return source, out


def test_offline_eval_sets_row_counts_schema_and_answers(offline_out):
    source, out = offline_out
    report = json.loads((out / "conversion_report.json").read_text())
    assert [d["dataset"] for d in report["datasets"]] == list(OFFLINE_NAMES)
    for name, stem in OFFLINE_NAMES.items():
        raw = _read_jsonl(source / f"{stem}.jsonl")
        assert len(raw) == conftest_data.MATH_EVAL_ROWS[stem]
        table = pq.read_table(out / f"{name}.parquet")
        assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        rows = table.to_pylist()
        assert len(rows) == conftest_data.MATH_EVAL_ROWS[stem], name
        for position, (row, record) in enumerate(zip(rows, raw, strict=True)):
            assert row["data_source"] == name and row["ability"] == "math"
            assert row["reward_model"] == {"style": "rule", "ground_truth": record["answer"].strip()}
            assert row["prompt"] == [  # the default template, qwen_math_system
                {"role": "system", "content": QWEN_MATH_INSTRUCTION},
                {"role": "user", "content": record["problem"].strip()},
            ]
            extra = row["extra_info"]
            assert set(extra) == set(EXTRA_INFO_FIELDS)
            assert (extra["split"], extra["index"], extra["question"], extra["answer"], extra["dataset"]) == (
                "test", position, record["problem"].strip(), record["answer"].strip(), name)
        entry = next(d for d in report["datasets"] if d["dataset"] == name)
        assert (entry["read"], entry["written"], entry["dropped"], entry["duplicates"]) == (len(raw), len(raw), {}, 0)
    math500 = pq.read_table(out / "math500.parquet").to_pylist()
    assert math500[0]["extra_info"]["subject"] == "Precalculus" and math500[0]["extra_info"]["level"] == "2"
    # --combine-eval joins every converted set, gsm8k_test included
    combined = sum(conftest_data.MATH_EVAL_ROWS[s] for s in OFFLINE_NAMES.values())
    assert pq.read_table(out / "val.parquet").num_rows == combined


def test_verl_rlhf_dataset_loads_them_with_a_qwen_tokenizer(offline_out):
    """verl's own dataset class reads the files (several at once: they share one schema) and its
    overlong-prompt filter keeps exactly the rows a direct token count says fit."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    _, out = offline_out
    tokenizer = conftest_data.qwen_tokenizer()
    files = [str(out / f"{name}.parquet") for name in ("aime24", "amc23")]
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    lengths = [
        len(tokenizer(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)["input_ids"])
        for r in rows
    ]
    limit = sorted(lengths)[-5]  # a limit that some prompts exceed, so the filter has work to do
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": limit, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "truncation": "error"})
    dataset = RLHFDataset(files, tokenizer, config)
    assert len(dataset) == sum(n <= limit for n in lengths) < len(rows)
    item = dataset[0]
    assert item["raw_prompt"] == rows[0]["prompt"]
    assert item["data_source"] == "aime24"
    assert item["reward_model"]["ground_truth"] == rows[0]["reward_model"]["ground_truth"]
    assert item["index"] == 0
    text = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
    assert QWEN_MATH_INSTRUCTION in text and text.rstrip().endswith("assistant")


def test_templates():
    q = "What is $\\{1,2\\}$?"
    assert get_template("qwen_math").messages(q) == [{"role": "user", "content": q + "\n" + QWEN_MATH_INSTRUCTION}]
    assert get_template("qwen_math_system").messages(q) == [
        {"role": "system", "content": QWEN_MATH_INSTRUCTION}, {"role": "user", "content": q}]
    assert get_template("plain").messages(q) == [{"role": "user", "content": q}]
    assert get_template("dapo").messages(q) == [{"role": "user", "content": DAPO_PREFIX + q + DAPO_SUFFIX}]
    with pytest.raises(ValueError, match="'nope'.*qwen_math, qwen_math_system, dapo, plain"):
        get_template("nope")
    assert set(TEMPLATES) == {"qwen_math", "qwen_math_system", "dapo", "plain"}


HUB_FORMAT_RECORDS = {
    # name: (raw record as the hub copy has it, expected question, expected ground truth)
    "dapo_math_17k": (
        {"data_source": "math_dapo",
         "prompt": [{"role": "user", "content": DAPO_PREFIX + "What is 2+3?" + DAPO_SUFFIX}],
         "ability": "MATH", "reward_model": {"ground_truth": "5", "style": "rule-lighteval/MATH_v2"},
         "extra_info": {"index": "a1b2"}},
        "What is 2+3?", "5"),
    "math_lighteval": (
        {"problem": "Halve 1.", "level": "Level 1", "type": "Algebra",
         "solution": "We get $\\boxed{3}$ first, no: it is $\\boxed{\\frac{1}{2}}$."},
        "Halve 1.", "\\frac{1}{2}"),
    "gsm8k": ({"question": "How many?", "answer": "Add them: 1000+234=<<1000+234=1234>>1234\n#### 1,234"},
              "How many?", "1234"),
    "amc23": ({"question": "Find x.", "answer": 27.0, "id": 3}, "Find x.", "27"),
    "olympiadbench": ({"question": "Find a and b.", "final_answer": ["$3$", "$\\frac{1}{2}$"]}, "Find a and b.",
                      "$3$, $\\frac{1}{2}$"),
    "math500": ({"problem": "P?", "answer": "\\pi", "subject": "Geometry", "level": 5, "unique_id": "test/g/1.json"},
                "P?", "\\pi"),
}


@pytest.mark.parametrize("name", list(HUB_FORMAT_RECORDS))
def test_hub_formats_via_local_files(tmp_path, name):
    record, question, answer = HUB_FORMAT_RECORDS[name]
    suffix = ".parquet" if name == "dapo_math_17k" else ".jsonl"
    path = tmp_path / f"raw{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist([record, record]), path)
    else:
        _write_jsonl(path, [record])
    out = tmp_path / "out"
    assert main(["convert", name, "--local", f"{name}={path}", "--out-dir", str(out), "--no-progress"]) == 0
    rows = pq.read_table(out / f"{name}.parquet").to_pylist()
    assert len(rows) == 1  # the DAPO copy holds the record twice: a training duplicate is removed
    assert rows[0]["extra_info"]["question"] == question
    assert rows[0]["reward_model"]["ground_truth"] == answer
    if name == "math500":
        extra = rows[0]["extra_info"]
        assert (extra["subject"], extra["level"], extra["source_id"]) == ("Geometry", "5", "test/g/1.json")


def test_drops_and_duplicates_are_counted_exactly():
    spec = get_spec("math500")
    records = [
        {"problem": "Q1", "answer": "1"},
        {"problem": "  ", "answer": "2"},  # empty question
        {"problem": "Q3"},  # missing answer
        {"problem": "Q3b", "answer": ""},  # missing answer
        {"problem": "q1 ", "answer": "1"},  # duplicate of Q1 (normalised)
        {"problem": "Q1", "answer": "7"},  # conflicting duplicate
        {"problem": "Q4", "answer": "4"},
    ]
    rows, report = convert_records(spec, records, template="plain", source="test", progress=False)
    assert report.dropped == Counter({"empty question": 1, "missing answer": 2})
    assert (report.read, report.duplicates, report.conflicting_duplicates) == (7, 2, 1)
    assert (report.duplicates_removed, report.written) == (0, 4)  # eval sets keep duplicates by default
    assert [r["extra_info"]["index"] for r in rows] == [0, 4, 5, 6]
    rows, report = convert_records(spec, records, template="plain", source="test", dedup="always", progress=False)
    assert (report.duplicates_removed, report.written) == (2, 2)
    assert [r["extra_info"]["index"] for r in rows] == [0, 6]
    rows, report = convert_records(get_spec("gsm8k"), [{"question": "A", "answer": "#### 1"}] * 3, template="plain",
                                   source="test", progress=False)
    assert (report.duplicates, report.duplicates_removed, report.written) == (2, 2, 1)  # train: dedup by default
    with pytest.raises(ValueError, match="'sometimes'.*auto, always, never"):
        convert_records(spec, records, template="plain", source="t", dedup="sometimes", progress=False)


_record = st.fixed_dictionaries(
    {"problem": st.sampled_from(["", " ", "A", "a ", "B", "What is $x$?", "what is  $x$ ?"])},
    optional={"answer": st.sampled_from(["", "1", "2", "\\frac12"])},
)


@settings(max_examples=200, deadline=None)
@given(records=st.lists(_record, max_size=20), dedup=st.sampled_from(["always", "never"]))
def test_every_record_is_accounted_for(records, dedup):
    rows, report = convert_records(get_spec("aime24"), records, template="qwen_math", source="t", dedup=dedup,
                                   progress=False)
    assert report.read == len(records)
    assert report.written + sum(report.dropped.values()) + report.duplicates_removed == len(records)
    indices = [r["extra_info"]["index"] for r in rows]
    assert indices == sorted(set(indices))
    keys = [normalize_question(r["extra_info"]["question"]) for r in rows]
    assert (len(set(keys)) == len(keys)) if dedup == "always" else True
    assert all(r["reward_model"]["ground_truth"] and r["extra_info"]["question"] for r in rows)


@given(
    # no backslash in the text: a space after one would make a LaTeX spacing command (removed on purpose)
    st.text(alphabet=string.ascii_letters + string.digits + "$_{}^+-=()[]<>/", min_size=1, max_size=60),
    st.lists(st.sampled_from([" ", "\n", "\t", "  ", "\\,", "\\!"]), min_size=1, max_size=5),
)
def test_normalize_question_ignores_case_and_spacing(text, spaces):
    spaced = "".join(ch + spaces[i % len(spaces)] for i, ch in enumerate(text))
    assert normalize_question(spaced.upper()) == normalize_question(text.lower()) == normalize_question(text)


def test_normalize_question_keeps_content():
    assert normalize_question("What is $1+2$?") != normalize_question("What is $1+3$?")
    assert normalize_question("\\dfrac{1}{2}") == normalize_question("\\frac{1}{2}")


def test_contamination_is_flagged_and_can_be_dropped(tmp_path):
    source = conftest_data.math_eval_dir()
    aime = _read_jsonl(source / "aime24.jsonl")
    leaked = "  " + aime[3]["problem"].upper().replace(" ", "   ") + " "
    train = _write_jsonl(tmp_path / "train.jsonl", [
        {"question": "An honest training question?", "answer": "#### 1"},
        {"question": leaked, "answer": "#### 2"},
    ])
    out = tmp_path / "out"
    argv = ["convert", "gsm8k", "aime24", "--local", f"gsm8k={train}", "--local-dir", str(source), "--offline",
            "--out-dir", str(out), "--no-progress"]
    assert main(argv) == 0
    report = json.loads((out / "conversion_report.json").read_text())
    assert [(c["train_set"], c["train_index"], c["eval_set"], c["eval_index"]) for c in report["contamination"]] == [
        ("gsm8k", 1, "aime24", 3)]
    assert pq.read_table(out / "gsm8k.parquet").num_rows == 2
    # the same check on files already written
    assert main(["contamination", "--train", str(out / "gsm8k.parquet"), "--eval", str(out / "aime24.parquet"),
                 "--report", str(tmp_path / "c.json")]) == 0
    assert len(json.loads((tmp_path / "c.json").read_text())) == 1
    assert main(argv + ["--drop-contaminated"]) == 0
    rows = pq.read_table(out / "gsm8k.parquet").to_pylist()
    assert [r["extra_info"]["question"] for r in rows] == ["An honest training question?"]
    entry = json.loads((out / "conversion_report.json").read_text())["datasets"][0]
    assert (entry["contaminated"], entry["contaminated_removed"], entry["written"]) == (1, 1, 1)


def test_cli_errors_name_the_bad_value(tmp_path, capsys):
    assert main(["convert", "aime2024", "--out-dir", str(tmp_path)]) == 2
    assert "unknown data set 'aime2024'; valid: dapo_math_17k" in capsys.readouterr().err
    assert main(["convert", "aime24", "--template", "chatml", "--out-dir", str(tmp_path)]) == 2
    assert "unknown prompt template 'chatml'; valid: qwen_math" in capsys.readouterr().err
    missing = f"aime24={tmp_path / 'missing.jsonl'}"
    assert main(["convert", "aime24", "--local", missing, "--out-dir", str(tmp_path)]) == 2
    assert f"data file not found: {tmp_path / 'missing.jsonl'}" in capsys.readouterr().err
    assert main(["convert", "aime24", "--offline", "--out-dir", str(tmp_path)]) == 2
    assert "--offline and no --local/--local-dir" in capsys.readouterr().err
    assert main(["convert", "aime24", "--local-dir", str(tmp_path), "--offline", "--out-dir", str(tmp_path)]) == 2
    assert "no file for data set 'aime24'" in capsys.readouterr().err
    assert main(["convert", "aime24", "--local", "aime24", "--out-dir", str(tmp_path)]) == 2
    assert "--local takes NAME=PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "convert" in capsys.readouterr().out


def test_hub_loading_calls_datasets_with_each_sets_id(monkeypatch):
    """The real hub path (no network here): datasets.load_dataset gets the id, config and split."""
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return [{"problem": "p", "answer": "1"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for spec in DATASETS.values():
        assert load_hub(spec) == [{"problem": "p", "answer": "1"}]
    assert calls[0] == ("BytedTsinghua-SIA/DAPO-Math-17k", None, "train")
    assert ("openai/gsm8k", "main", "test") in calls
    assert ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train") in calls
    assert set(GROUPS["eval"]) <= set(DATASETS)


def test_list_command(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DATASETS) and "template qwen_math_system (default)" in out
