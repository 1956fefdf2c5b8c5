"""Maths data sets in verl's RL parquet schema (`python -m tepo_verl.data --help`).

registry: known sets (hub ids, fields, offline names); templates: prompt templates; records/sources: reading;
convert: raw -> verl rows with a report; contamination: train/eval overlap; schema: verl's columns, parquet I/O.
"""

from tepo_verl.extras import require

require("reward", __name__)  # data conversion is in the 'reward' extra: one line naming it where it is missing

from tepo_verl.data.cli import main  # noqa: E402
from tepo_verl.data.contamination import find_overlaps, normalize_question  # noqa: E402
from tepo_verl.data.convert import convert_records  # noqa: E402
from tepo_verl.data.registry import DATASETS, GROUPS, get_spec  # noqa: E402
from tepo_verl.data.schema import read_parquet, write_parquet  # noqa: E402
from tepo_verl.data.templates import TEMPLATES, get_template  # noqa: E402

__all__ = [
    "DATASETS", "GROUPS", "TEMPLATES", "convert_records", "find_overlaps", "get_spec", "get_template", "main",
    "normalize_question", "read_parquet", "write_parquet",
]
