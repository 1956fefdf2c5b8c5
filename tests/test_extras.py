"""The plugin requires what loading and running the loss needs; the tools' dependencies are extras, and a tool used
without its extra says so in one line naming it.

A missing extra is simulated in a fresh interpreter by a `sys.meta_path` finder that refuses the extra's modules, as
an environment without them would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest_data import require_module

from tepo_verl import extras

REPO = Path(__file__).resolve().parents[1]

#: Put first in a fresh interpreter: every module of $BLOCKED is not installed, as far as imports and
#: importlib.util.find_spec can tell (`import X` raises ModuleNotFoundError, find_spec("X") is None).
BLOCKER = textwrap.dedent(
    """
    import os, sys

    for name in filter(None, os.environ["BLOCKED"].split(",")):
        sys.modules[name] = None
    """
)


def _run(code: str, blocked, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, BLOCKED=",".join(blocked))
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code), *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _verls_own_modules() -> set[str]:
    """The top-level modules of the distributions installed verl requires, directly or through others."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, requires

    seen, todo = set(), ["verl"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [re.split(r"[ ;<>=!\[~(]", need, maxsplit=1)[0].lower().replace("_", "-")
                 for need in needs if "extra ==" not in need]
    return {module for module, dists in packages_distributions().items()
            if any(dist.lower().replace("_", "-") in seen for dist in dists)}


def _modules(extra: str) -> list[str]:
    return [module for _, module in extras.EXTRAS[extra]]


CLI = "import sys\nfrom tepo_verl.cli import main\nsys.exit(main(sys.argv[1:]))\n"


@pytest.mark.parametrize("extra, blocked, argv", [
    ("report", ["scipy"], ["compare", "{tmp}"]),
    ("report", ["matplotlib", "tabulate"], ["compare", "{tmp}"]),
    ("reward", ["math_verify"], ["eval", "{tmp}/samples.jsonl"]),
    ("reward", ["math_verify", "pebble"], ["data", "convert", "aime24", "--out-dir", "{tmp}/out"]),
])
def test_a_command_without_its_extra_names_the_extra_in_one_line(extra, blocked, argv, tmp_path):
    proc = _run(CLI, blocked, *[arg.replace("{tmp}", str(tmp_path)) for arg in argv], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"tepo-verl {argv[0]}: error: ") and line.endswith(f"pip install 'tepo-verl[{extra}]'")
    assert f"'{extra}' extra ({', '.join(blocked)} not installed)" in line, line


def test_a_gpu_recipe_without_the_reward_extra_stops_in_one_line(tmp_path):
    """The recipes score with tepo-verl's maths reward: without its extra they stop before verl starts, in one line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['math_verify'] = None  # not installed\n")
    env = dict(os.environ, DRY_RUN="1", OUTPUT_DIR=str(tmp_path), DATA_DIR=str(tmp_path / "data"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    proc = subprocess.run(["bash", str(REPO / "recipes" / "smoke-1gpu.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:]
    assert proc.stderr == ("error: tepo_verl.reward needs tepo-verl's 'reward' extra (math_verify not installed): "
                           "pip install 'tepo-verl[reward]'\n")


def test_the_loss_loads_and_runs_without_any_extra_and_verl_loading_the_reward_names_its_extra():
    """`import verl` registers TEPO, and the loss and the estimator compute, with every module of the reward and
    report extras gone that verl does not need itself (it brings pandas, pyarrow, datasets with it). In the same
    process verl loads tepo_verl/reward/math_reward.py by path, as the GPU recipes have its reward workers do: the
    error it raises names the extra."""
    require_module("verl")
    code = """
        import json, torch
        import verl
        import tepo_verl
        from tepo_verl.verl_adapter import plugin
        from verl.trainer.ppo import core_algos
        from verl.utils.import_utils import load_extern_object
        from omegaconf import OmegaConf
        config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
                                   "policy_loss": {"loss_mode": "tepo", "tepo": {"mask_rule": "always"}}})
        torch.manual_seed(0)
        log_prob, old = torch.randn(4, 5), torch.randn(4, 5)
        advantages, mask = torch.randn(4, 1).expand(4, 5), torch.ones(4, 5)
        loss, _ = core_algos.get_policy_loss_fn("tepo")(old, log_prob, advantages, mask, "token-mean", config)
        scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        adv, _ = core_algos.get_adv_estimator_fn("tepo")(scores, torch.ones(4, 3), ["a", "a", "b", "b"])
        try:
            load_extern_object(tepo_verl.__path__[0] + "/reward/math_reward.py", "compute_score")
            reward_error = None
        except RuntimeError as error:  # verl wraps what the module raised
            reward_error = f"{type(error.__cause__).__name__} {error.__cause__}"
        print(json.dumps({"error": repr(plugin.LOAD_ERROR), "loss": float(loss), "adv": adv[:, 0].tolist(),
                          "reward_error": reward_error}))
        """
    blocked = [module for module in _modules("reward") + _modules("report") if module not in _verls_own_modules()]
    assert {"math_verify", "pebble", "matplotlib", "tabulate"} <= set(blocked)
    proc = _run(code, blocked)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] == "None" and out["loss"] == out["loss"]  # loaded, and a finite (not NaN) loss
    assert out["adv"][0] > 0 > out["adv"][1]  # the estimator ran: the rewarded response of group a is above its mate
    missing = ", ".join(module for module in _modules("reward") if module in blocked)
    assert out["reward_error"] == (f"MissingExtra tepo_verl.reward needs tepo-verl's 'reward' extra ({missing} not "
                                   "installed): pip install 'tepo-verl[reward]'")


def test_the_plugins_requirements_are_the_losss_and_the_tools_are_extras(tmp_path):
    """The metadata setup.py builds (egg_info, as pip's build does): four requirements, and every tool dependency in
    the extra a user would guess."""
    proc = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    sections, current = {}, ""
    for line in (tmp_path / "tepo_verl.egg-info" / "requires.txt").read_text().splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif line:
            sections.setdefault(current, []).append(line)
    names = {extra: {requirement.split("[")[0].split(">")[0].split("<")[0].split("=")[0] for requirement in reqs}
             for extra, reqs in sections.items()}
    assert names[""] == {"verl", "hydra-core", "omegaconf", "packaging"} and len(sections[""]) == 4, sections[""]
    assert names["report"] == {"pandas", "scipy", "matplotlib", "tabulate"}
    assert names["reward"] == {"math-verify", "pebble", "datasets", "pyarrow", "tqdm"}
    assert names["test"] >= names["report"] | names["reward"] | names["trainer"] | {"pytest", "hypothesis"}
    sources = (tmp_path / "tepo_verl.egg-info" / "SOURCES.txt").read_text().splitlines()
    assert not [path for path in sources if "tepo_lab" in path or "/tiny/" in path or path.endswith(".sh")]


def test_require_refuses_an_unknown_extra():
    with pytest.raises(ValueError, match="unknown extra 'tools'; valid: reward, report, trainer"):
        extras.require("tools", "x")
    extras.require("report", "x")  # installed here: nothing happens
