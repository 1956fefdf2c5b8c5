"""benchmarks/study.py (not a package) as the module `study`, loaded once per process for every test that reads it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

STUDY_PY = Path(__file__).resolve().parents[1] / "benchmarks" / "study.py"


def load_study():
    if "study" not in sys.modules:
        spec = importlib.util.spec_from_file_location("study", STUDY_PY)
        sys.modules["study"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["study"])
    return sys.modules["study"]
