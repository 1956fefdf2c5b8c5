#!/usr/bin/env bash
# The plugin as a cluster installs it, checked end to end:
#
#   1. build its wheel (`pip wheel . --no-deps`, from a copy of this checkout) and read it: the plugin, its presets
#      and its entry point; no tiny weights, no CPU installer, no lab; its requirements are verl, hydra-core,
#      omegaconf and packaging, the tools' are extras;
#   2. install it into a fresh virtual environment (torch first, pinned: a bare torch could pull a CUDA build; then
#      the wheel, which pulls verl and what verl needs from the package index);
#   3. there: `python -m verl.trainer.main_ppo algorithm=tepo --cfg job` composes with the TEPO loss and estimator,
#      `import verl` loads TEPO and no lab or report module, no report package is there because of tepo-verl, a
#      tool without its extra says which in one line, and `tepo-verl demo` says where the demo runs.
#
#   bash tools/check_wheel.sh            # or: make check-wheel, or: python -m pytest tests/test_wheel.py
#
# Needs python3 >= 3.10 and the package index (verl's release and its dependencies): about 10 minutes on 2 cores
# (torch 3, verl and its dependencies 5). Prints one line per stage with its time, and `ok` at the end; on a
# failure, what failed and the log's end (exit 1). Env: PYTHON3 (default python3), TORCH (default 2.13.0, the CPU
# build the Makefile installs), WORK_DIR (default: a temporary folder, removed at the end unless KEEP=1).
set -euo pipefail
# only what the wheel installs may be importable there: not this checkout, nor another environment's packages
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP VIRTUAL_ENV

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON3="${PYTHON3:-python3}"
TORCH="${TORCH:-2.13.0}"
if [[ -n "${WORK_DIR:-}" ]]; then
  WORK="$WORK_DIR"
  mkdir -p "$WORK"
else
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/tepo-verl-wheel.XXXXXX")"
  [[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "$WORK"' EXIT
fi
LOG="$WORK/check.log"
: > "$LOG"
VPY="$WORK/venv/bin/python"
PIP=(-m pip install --disable-pip-version-check --progress-bar off)

# stage NAME COMMAND...: run it with its output in the log; one line with its time, or the log's end and exit 1.
# (A function run by `stage` runs under `if`, where `set -e` does not act: each one returns its failures itself.)
stage() {
  local name=$1 started=$SECONDS
  shift
  echo "== $name: $*" >> "$LOG"
  if "$@" >> "$LOG" 2>&1; then
    echo "[check_wheel] $name: ok ($((SECONDS - started)) s)"
  else
    echo "[check_wheel] $name: FAILED after $((SECONDS - started)) s; the end of $LOG:" >&2
    tail -n 30 "$LOG" | sed 's/^/    /' >&2
    exit 1
  fi
}

copy_checkout() {
  mkdir -p "$WORK/src" || return 1
  # the working tree as it is, without what is not the package's to build (environments, runs, the study's data)
  tar -C "$REPO" --exclude='./.git' --exclude='./.venv*' --exclude='./runs' --exclude='./benchmarks/results' \
      --exclude='./build' --exclude='*.egg-info' --exclude='__pycache__' -cf - . | tar -C "$WORK/src" -xf -
}

build_wheel() {
  "$PYTHON3" -m pip wheel --disable-pip-version-check --progress-bar off --no-deps -w "$WORK/wheel" "$WORK/src"
}

read_wheel() {
  "$PYTHON3" - "$WORK"/wheel/tepo_verl-*.whl <<'PYEOF'
import email, sys, zipfile

wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
print(f"{len(names)} files in {sys.argv[1]}")
lab = [n for n in names if "tepo_lab" in n or "/tiny/" in n or "/cpu/" in n or n.endswith((".sh", ".safetensors"))]
assert not lab, f"the wheel carries the lab: {lab[:10]}"
for needed in ("tepo_verl/config/algorithm/tepo.yaml", "tepo_verl/verl_adapter/entrypoint.py",
               "tepo_verl/core/loss.py", "hydra_plugins/tepo_verl_searchpath/__init__.py"):
    assert needed in names, f"the wheel lacks {needed}"
info = next(n for n in names if n.endswith(".dist-info/METADATA"))
metadata = email.message_from_bytes(wheel.read(info))
requires = metadata.get_all("Requires-Dist")
base = sorted(r for r in requires if "extra ==" not in r)
print("requires:", base)
names = [r.split("<")[0].split(">")[0].split("=")[0] for r in base]
assert names == ["hydra-core", "omegaconf", "packaging", "verl"], base
extras = sorted(metadata.get_all("Provides-Extra"))
print("extras:", extras)
assert {"reward", "report", "trainer", "test"} <= set(extras), extras
entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
assert "tepo = tepo_verl.verl_adapter.entrypoint" in entry_points and "tepo_lab" not in entry_points, entry_points
PYEOF
}

make_venv() {
  rm -rf "$WORK/venv" || return 1
  "$PYTHON3" -m venv "$WORK/venv"
}

compose() {
  # from an empty folder: nothing of the checkout is importable, only what the wheel installed
  mkdir -p "$WORK/run" || return 1
  (cd "$WORK/run" && "$VPY" -m verl.trainer.main_ppo algorithm=tepo --cfg job > "$WORK/run/job.yaml") || return 1
  (cd "$WORK/run" && "$VPY" - "$WORK/run/job.yaml" <<'PYEOF'
import sys
from omegaconf import OmegaConf

config = OmegaConf.load(sys.argv[1])
loss, estimator = config.actor_rollout_ref.actor.policy_loss.loss_mode, config.algorithm.adv_estimator
options = dict(config.actor_rollout_ref.actor.policy_loss.tepo)
print(f"composed: loss_mode={loss} adv_estimator={estimator} tepo options={options}")
assert loss == "tepo" and estimator == "tepo", (loss, estimator)
PYEOF
  )
}

what_import_verl_loads() {
  (cd "$WORK/run" && "$VPY" - <<'PYEOF'
import sys
import verl
from tepo_verl.verl_adapter import plugin

loaded = sorted(sys.modules)
assert plugin.LOAD_ERROR is None, plugin.LOAD_ERROR
assert "tepo_verl.core.loss" in loaded and "tepo_verl.verl_adapter.registry" in loaded
unwanted = [m for m in loaded if m.split(".")[0] == "tepo_lab" or m.startswith(
    ("tepo_verl.report", "tepo_verl.data", "tepo_verl.evaluation", "tepo_verl.reward"))]
assert not unwanted, unwanted
print(f"import verl: {sum(m.startswith('tepo_verl') for m in loaded)} tepo_verl modules, no lab or report module")
PYEOF
  )
}

report_stack_origin() {
  # which of the report's packages are installed, and what asked for each: never tepo-verl (verl may bring some)
  "$VPY" - <<'PYEOF'
from importlib.metadata import PackageNotFoundError, distributions, version
import re

wanted = ["pandas", "scipy", "matplotlib", "tabulate", "math-verify", "pebble"]
asked = {name: [] for name in wanted}
for dist in distributions():
    for requirement in dist.requires or []:
        if "extra ==" in requirement:
            continue
        name = re.split(r"[ ;<>=!\[~(]", requirement, maxsplit=1)[0].lower()
        if name in asked:
            asked[name].append(dist.metadata["Name"])
for name in wanted:
    try:
        installed = version(name)
    except PackageNotFoundError:
        installed = None
    by = f", required by {', '.join(sorted(asked[name])) or 'nothing installed'}" if installed else ""
    print(f"{name}: {installed or 'not installed'}{by}")
    assert "tepo-verl" not in asked[name], f"tepo-verl requires {name}"
PYEOF
}

missing_extras_are_named() {
  local out
  (cd "$WORK/run" && "$WORK/venv/bin/tepo-verl" demo 2> "$WORK/run/demo.err") && return 1
  grep -q "make demo" "$WORK/run/demo.err" || return 1
  echo "tepo-verl demo: $(cat "$WORK/run/demo.err")"
  for extra in report reward; do
    local command=(compare "$WORK/run")
    [[ "$extra" == reward ]] && command=(eval "$WORK/run/none.jsonl")
    if "$VPY" -c "import sys; from tepo_verl.extras import require; require('$extra', 'x')" 2>/dev/null; then
      echo "$extra: every module is installed here (through verl), so there is no missing extra to name"
      continue
    fi
    (cd "$WORK/run" && "$WORK/venv/bin/tepo-verl" "${command[@]}" 2> "$WORK/run/$extra.err") && return 1
    out="$(cat "$WORK/run/$extra.err")"
    echo "tepo-verl ${command[0]}: $out"
    [[ "$(wc -l < "$WORK/run/$extra.err")" == 1 && "$out" == *"pip install 'tepo-verl[$extra]'"* ]] || return 1
  done
}

echo "[check_wheel] work folder: $WORK (log: $LOG)"
stage "copy the checkout" copy_checkout
stage "build the wheel" build_wheel
stage "read the wheel" read_wheel
stage "fresh venv" make_venv
stage "torch $TORCH" "$VPY" "${PIP[@]}" "torch==$TORCH"
stage "install the wheel (and verl)" "$VPY" "${PIP[@]}" "$WORK"/wheel/tepo_verl-*.whl
stage "compose algorithm=tepo --cfg job" compose
stage "import verl" what_import_verl_loads
stage "the report's packages" report_stack_origin
stage "missing extras" missing_extras_are_named
SUMMARY='^(requires|extras|composed|import verl|pandas|scipy|matplotlib|tabulate|math-verify|pebble|tepo-verl )'
grep -E "$SUMMARY" "$LOG" | sed 's/^/    /'
WHEEL="$(basename "$WORK"/wheel/tepo_verl-*.whl)"
echo "[check_wheel] ok: $WHEEL installs into a fresh venv and composes algorithm=tepo"
