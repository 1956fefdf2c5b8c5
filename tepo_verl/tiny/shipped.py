"""The tiny policies shipped inside the package: the same starting weights on every machine.

A warm-up trained here differs in its last bits across CPUs, and hundreds of warm-up steps amplify that into a
different policy (another greedy accuracy, another entropy). So the builders (build.py for the addition task,
scratchpad.py for the scratchpad task) copy these files instead of training, whenever the requested spec is the
one a policy was shipped for (its build key).

    tepo_verl/tiny/policies/<task>/   config.json, generation_config.json, model.safetensors, tokenizer files,
                                      manifest.json: the build key and spec, the sha256 of every file, the greedy
                                      and sampled (T=1) validation accuracy measured on the shipped weights

Regenerate (trains with the builder on this machine, single-threaded, then measures and writes the package folder):

    python -m tepo_verl.tiny.shipped regenerate --task addition|scratchpad|chain [--from BUILD_DIR]

`--from` ships the model of an existing build of the same key (tepo-verl tiny build --retrain --out BUILD_DIR)
instead of training again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

POLICIES = Path(__file__).resolve().parent / "policies"
TASKS = ("addition", "scratchpad", "chain")
WEIGHTS = "model.safetensors"
#: The files of a policy folder (the model folder of a build), manifest.json aside.
FILES = ("config.json", "generation_config.json", WEIGHTS, "tokenizer.json", "tokenizer_config.json",
         "vocab.json", "merges.txt", "special_tokens_map.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def folder(task: str) -> Path:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
    return POLICIES / task


def manifest(task: str) -> dict | None:
    path = folder(task) / "manifest.json"
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
        raise FileNotFoundError(f"no shipped policy for task {task!r} in {folder(task)}")
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in shipped["files"].items():
        if sha256(folder(task) / name) != digest:
            raise RuntimeError(f"shipped policy file {folder(task) / name} does not match its manifest's sha256 "
                               f"(corrupted or a Git LFS pointer?)")
        shutil.copyfile(folder(task) / name, model_dir / name)


def _addition_measure(model_dir: Path, spec) -> dict:
    """The addition builder's own measurement (build.sample_accuracy), single-threaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tepo_verl.tiny import task as addition
    from tepo_verl.tiny.build import sample_accuracy
    from tepo_verl.tiny.scratchpad import generate, responses_sha256

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        ranges = {"a_range": tuple(spec.a_range), "b_range": tuple(spec.b_range)}
        val = addition.problems(spec.val_size, seed=spec.seed * 1000 + 2, **ranges)
        responses, gap = generate(model, tok, [addition.question(a, b) for a, b in val], max_new_tokens=6)
        return {"greedy": sample_accuracy(model, tok, val, seed=spec.seed, temperature=0.0),
                "sampled": sample_accuracy(model, tok, val, seed=spec.seed, temperature=1.0),
                "gap": gap, "responses_sha256": responses_sha256([tok.decode(r) for r in responses]),
                "parameters": sum(p.numel() for p in model.parameters())}
    finally:
        torch.set_num_threads(threads)


def measure(task: str, model_dir: Path) -> dict:
    """The manifest's measured fields for the policy in model_dir, with the default spec of `task`."""
    if task == "addition":
        from tepo_verl.tiny.build import TinySpec

        spec = TinySpec()
        got = _addition_measure(model_dir, spec)
        return {"val_accuracy_greedy": got["greedy"], "val_accuracy_sampled_t1": got["sampled"],
                "greedy_min_top2_logit_gap": got["gap"], "greedy_responses_sha256": got["responses_sha256"],
                "parameters": got["parameters"], "val_size": spec.val_size}
    from tepo_verl.tiny.scratchpad import measure as scratch_measure

    spec = default_spec(task)
    got = scratch_measure(model_dir, spec)
    return {"val_accuracy_greedy": got["greedy"]["accuracy"], "val_accuracy_sampled_t1": got["sampled"]["accuracy"],
            "val_mean_response_tokens_greedy": got["greedy"]["mean_response_tokens"],
            "val_mean_response_tokens_sampled_t1": got["sampled"]["mean_response_tokens"],
            "greedy_min_top2_logit_gap": got["greedy"]["min_top2_logit_gap"],
            "greedy_responses_sha256": got["greedy"]["responses_sha256"],
            "parameters": got["parameters"], "val_size": spec.val_size}


def default_spec(task: str):
    if task == "addition":
        from tepo_verl.tiny.build import TinySpec

        return TinySpec()
    from tepo_verl.tiny.scratchpad import ChainSpec, ScratchSpec

    return {"scratchpad": ScratchSpec, "chain": ChainSpec}[task]()


def regenerate(task: str, from_dir: Path | None = None, log=print) -> dict:
    """Train (or take from_dir's model) with the default spec, measure, and write the package folder."""
    import dataclasses

    spec = default_spec(task)
    with tempfile.TemporaryDirectory() as tmp:
        if from_dir is None:
            if task == "addition":
                from tepo_verl.tiny.build import build

                build(Path(tmp) / "b", spec, retrain=True, log=log)
            else:
                from tepo_verl.tiny.scratchpad import build

                build(Path(tmp) / "b", spec, retrain=True, log=log)
            from_dir = Path(tmp) / "b"
        from_dir = Path(from_dir)
        built = json.loads((from_dir / "manifest.json").read_text())
        if built.get("key") != spec.key():
            raise ValueError(f"{from_dir} was built with key {built.get('key')}, not the default spec's {spec.key()}")
        target = folder(task)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in FILES:
            shutil.copyfile(from_dir / "model" / name, target / name)
    measured = measure(task, target)
    record = {
        "task": task,
        "key": spec.key(),
        "spec": dataclasses.asdict(spec),
        "files": {name: sha256(target / name) for name in FILES},
        "decoding": "float32, torch.set_num_threads(1), one left-padded batch of the validation problems; "
                    "greedy, and sampled at temperature 1 with torch.Generator seeded with spec.seed",
        **measured,
    }
    (target / "manifest.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    log(f"[shipped] {task}: {target} (weights {record['files'][WEIGHTS][:12]}, greedy "
        f"{record['val_accuracy_greedy']:.4f}, sampled {record['val_accuracy_sampled_t1']:.4f})")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tepo_verl.tiny.shipped", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("regenerate", help="train the default spec's policy and write the package folder")
    r.add_argument("--task", choices=TASKS, required=True)
    r.add_argument("--from", dest="from_dir", type=Path, default=None,
                   help="ship the model of this build folder (same key) instead of training")
    sub.add_parser("show", help="print the shipped manifests")
    args = parser.parse_args(argv)
    if args.command == "show":
        print(json.dumps({task: manifest(task) for task in TASKS}, indent=2, sort_keys=True))
        return 0
    regenerate(args.task, args.from_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
