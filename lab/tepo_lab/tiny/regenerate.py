"""Regenerate a policy shipped in the package (lab/tepo_lab/tiny/shipped.py): train it with its task's builder on this
machine, single-threaded (or take the model of an existing build of the same key), measure it, and write the
package folder with its manifest.

    python -m tepo_lab.tiny.regenerate --task addition|scratchpad|chain [--from BUILD_DIR]

`--from` ships the model of an existing build of the default spec (tepo-lab tiny build --retrain --out BUILD_DIR)
instead of training again.

The imports run one way: this module knows the builders and the store (shipped.py); the builders know only the
store. A task module (build.py, scratchpad.py) gives a spec class, `build(out, spec, retrain=..., log=...)` and
`shipped_measurements(model_dir, spec)`; a line of TASKS below names the three.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tepo_lab.tiny import scratchpad, shipped
from tepo_lab.tiny.build import TinySpec, shipped_measurements
from tepo_lab.tiny.build import build as build_addition


@dataclasses.dataclass(frozen=True)
class Task:
    spec: type  # the default spec is spec()
    build: Callable[..., dict]  # build(out, spec, retrain=..., log=...): the build folder's manifest
    measure: Callable[[Path, object], dict]  # (model_dir, spec): the measured fields of the shipped manifest


TASKS = {
    "addition": Task(TinySpec, build_addition, shipped_measurements),
    "scratchpad": Task(scratchpad.ScratchSpec, scratchpad.build, scratchpad.shipped_measurements),
    "chain": Task(scratchpad.ChainSpec, scratchpad.build, scratchpad.shipped_measurements),
}


def task_of(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(TASKS)}")
    return TASKS[name]


def regenerate(name: str, from_dir: Path | None = None, log=print) -> dict:
    """Train (or take from_dir's model) with the default spec, measure, and write the package folder."""
    task = task_of(name)
    spec = task.spec()
    with tempfile.TemporaryDirectory() as tmp:
        if from_dir is None:
            from_dir = Path(tmp) / "b"
            task.build(from_dir, spec, retrain=True, log=log)
        built = json.loads((Path(from_dir) / "manifest.json").read_text())
        if built.get("key") != spec.key():
            raise ValueError(f"{from_dir} was built with key {built.get('key')}, not the default spec's {spec.key()}")
        measured = task.measure(Path(from_dir) / "model", spec)
        record = shipped.write(name, Path(from_dir), dataclasses.asdict(spec), measured)
    log(f"[shipped] {name}: {shipped.folder(name)} (weights {record['files'][shipped.WEIGHTS][:12]}, greedy "
        f"{record['val_accuracy_greedy']:.4f}, sampled {record['val_accuracy_sampled_t1']:.4f})")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tepo_lab.tiny.regenerate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--from", dest="from_dir", type=Path, default=None,
                        help="ship the model of this build folder (same key) instead of training")
    args = parser.parse_args(argv)
    regenerate(args.task, args.from_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
