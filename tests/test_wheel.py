"""The plugin as a cluster installs it: tools/check_wheel.sh builds its wheel, checks that it carries no lab (no tiny
weights, no CPU installer) and requires only what the loss needs, installs it into a fresh virtual environment with
verl from the package index, and composes `python -m verl.trainer.main_ppo algorithm=tepo --cfg job` there.

It needs the package index and about 10 minutes on 2 cores (measured: torch 3 min and verl with its dependencies
5 min of it), more than CI's budget for one check, so the suite (`make test`, CI) leaves it out unless
TEPO_VERL_WHEEL_CHECK=1 (tests/conftest.py); naming this file runs it:

    python -m pytest tests/test_wheel.py      # or, without pytest: make check-wheel
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_alone_and_composes_algorithm_tepo(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "tools" / "check_wheel.sh")],
                          env=dict(os.environ, WORK_DIR=str(tmp_path)), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "composed: loss_mode=tepo adv_estimator=tepo" in out, out
    assert "import verl: " in out and "no lab or report module" in out, out
    assert "requires: ['hydra-core" in out and out.rstrip().splitlines()[-1].startswith("[check_wheel] ok: "), out
