"""The tiny policies shipped inside the package: the same starting weights on every machine.

A warm-up trained here differs in its last bits across CPUs, and hundreds of warm-up steps amplify that into a
different policy (another greedy accuracy, another entropy). So the builders (build.py for the addition task,
scratchpad.py for the scratchpad and chain tasks) copy these files instead of training, whenever the requested spec is
the one a policy was shipped for (its build key). This module is the store the builders read; it knows no builder.

    lab/tepo_lab/tiny/policies/<task>/   config.json, generation_config.json, model.safetensors, tokenizer files,
                                      manifest.json: the build key and spec, the sha256 of every file, the greedy
                                      and sampled (T=1) validation accuracy measured on the shipped weights

Regenerate one with lab/tepo_lab/tiny/regenerate.py (it trains with the task's builder, measures, and calls write()):

    python -m tepo_lab.tiny.regenerate --task addition|scratchpad|chain [--from BUILD_DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

POLICIES = Path(__file__).resolve().parent / "policies"
WEIGHTS = "model.safetensors"
#: The files of a policy folder (the model folder of a build), manifest.json aside.
FILES = ("config.json", "generation_config.json", WEIGHTS, "tokenizer.json", "tokenizer_config.json",
         "vocab.json", "merges.txt", "special_tokens_map.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tasks() -> list[str]:
    """The tasks a policy is shipped for (the folders under policies/ that hold a manifest)."""
    return sorted(path.parent.name for path in POLICIES.glob("*/manifest.json"))


def folder(task: str) -> Path:
    if task not in tasks():
        raise ValueError(f"no policy is shipped for task {task!r}; shipped: {', '.join(tasks())}")
    return POLICIES / task


def manifest(task: str) -> dict | None:
    path = POLICIES / task / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def source_for(task: str, key: str) -> str | None:
    """`shipped:<sha256 of the weights, 12 digits>` when a policy is shipped for this task and build key, else None."""
    shipped = manifest(task)
    if shipped is None or shipped.get("key") != key:
        return None
    return "shipped:" + shipped["files"][WEIGHTS][:12]


def install(task: str, model_dir: Path) -> None:
    """Copy the shipped policy into model_dir, checking every file against the manifest's sha256."""
    shipped = manifest(task)
    if shipped is None:
        raise FileNotFoundError(f"no policy is shipped for task {task!r} in {POLICIES}; shipped: {', '.join(tasks())}")
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in shipped["files"].items():
        if sha256(folder(task) / name) != digest:
            raise RuntimeError(f"shipped policy file {folder(task) / name} does not match its manifest's sha256 "
                               f"(corrupted or a Git LFS pointer?)")
        shutil.copyfile(folder(task) / name, model_dir / name)


def write(task: str, from_dir: Path, spec: dict, measured: dict) -> dict:
    """Ship the model of the build folder from_dir (built with the spec `spec`) as `task`'s policy: its files and a
    manifest of their sha256, the build's key, the spec and the `measured` fields. Returns the manifest."""
    from_dir = Path(from_dir)
    key = json.loads((from_dir / "manifest.json").read_text())["key"]
    target = POLICIES / task
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(from_dir / "model" / name, target / name)
    record = {
        "task": task,
        "key": key,
        "spec": spec,
        "files": {name: sha256(target / name) for name in FILES},
        "decoding": "float32, torch.set_num_threads(1), one left-padded batch of the validation problems; "
                    "greedy, and sampled at temperature 1 with torch.Generator seeded with spec.seed",
        **measured,
    }
    (target / "manifest.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tepo_lab.tiny.shipped",
                                     description="print the manifests of the shipped policies")
    parser.parse_args(argv)
    print(json.dumps({task: manifest(task) for task in tasks()}, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
