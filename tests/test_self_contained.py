"""The product speaks only of itself: no tracked file cites a file outside the repository, a machine path or an
issue-tracker number. The tests alone may locate the offline data folder beside the repository
(`tests/conftest_data.py`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest_data import skip_or_fail  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: (pattern, what it is). The issue pattern is this project's tracker style ("issue 4"); upstream projects' bug
#: numbers (e.g. "Math-Verify issues 50 and 55") are provenance of a workaround and stay.
FORBIDDEN = [
    (re.compile(r"shared/"), "a file outside the repository"),
    (re.compile(r"(?<![\w/])/(?:tmp|work)/"), "a machine path"),
    (re.compile(r"\b[Ii]ssue \d+\b"), "an issue-tracker number"),
]
ALLOWED = {"tests/conftest_data.py": {"a file outside the repository"}, "tests/test_self_contained.py": None}
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".ini", ".cfg", ".toml", ".txt", ""}


def tracked_files() -> list[str]:
    if not (REPO / ".git").exists():
        skip_or_fail("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [name for name in out.splitlines() if Path(name).suffix in SUFFIXES and (REPO / name).is_file()]


def test_no_tracked_file_cites_what_is_not_in_the_repository():
    found = []
    for name in tracked_files():
        allowed = ALLOWED.get(name, set())
        if allowed is None:
            continue
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for pattern, what in FORBIDDEN:
                if what not in allowed and pattern.search(line):
                    found.append(f"{name}:{number}: {what}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
