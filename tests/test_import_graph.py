"""The imports of the plugin (tepo_verl) and of its lab (lab/tepo_lab) run one way.

Statically, read from the source with ast (nothing is imported): no module imports, directly or through others, a
module that imports it back (function-level imports, `__import__` and `importlib.import_module` of a constant name
count too), and no module of the plugin imports or names a module of the lab; the lab imports the plugin.

At run time, in a fresh interpreter: `import verl` with the plugin installed loads TEPO's core, its adapter and its
presets' search path, and no module of the lab (the CPU mode, the tiny models, the demo), the report, the data,
reward and evaluation tools, or the study.
"""

from __future__ import annotations

import ast
import json
import os
import re
import textwrap
from pathlib import Path

import fresh_python
from conftest_data import require_module, skip_or_fail

REPO = Path(__file__).resolve().parents[1]
#: package -> the folder that holds it
ROOTS = {"tepo_verl": REPO, "tepo_lab": REPO / "lab"}
#: a string constant that names a module of the lab, as `importlib.import_module` or a "module:function" table takes it
LAB_MODULE_NAME = re.compile(r"tepo_lab(\.\w+)*(:\w+)?")


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _dynamic_import(node: ast.AST) -> str | None:
    """The module named by `__import__("a.b")` or `importlib.import_module("a.b")` (a constant), else None."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name in ("__import__", "import_module") and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _imports(source: str, name: str, is_package: bool, modules: dict) -> set[str]:
    """The modules of `modules` that module `name` imports: `from a.b import c` names a.b.c when that is a module."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif _dynamic_import(node):
            out.add(_dynamic_import(node))
    return {target for target in out if target in modules and target != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path.read_text(), name, path.name == "__init__.py", modules)
            for name, path in modules.items()}


def _names_of_lab_modules(source: str) -> list[str]:
    """String constants that name a module of the lab (what a command table or an import by name would hold)."""
    return [node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and LAB_MODULE_NAME.fullmatch(node.value)]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    circles, done = [], set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            circles.append(stack[stack.index(node):] + [node])
            return
        if node in done:
            return
        for target in sorted(graph[node]):
            # a package's __init__ is imported with each of its modules: that is not a circle of the code's making
            if not node.startswith(target + "."):
                visit(target, stack + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return circles


def test_the_plugin_and_the_lab_have_no_import_circle():
    assert _circles(_graph()) == []


def test_the_plugin_never_imports_the_lab():
    graph = _graph()
    plugin = {name: targets for name, targets in graph.items() if name.split(".")[0] == "tepo_verl"}
    assert plugin and {name: sorted(t for t in targets if t.startswith("tepo_lab")) for name, targets in plugin.items()
                       if any(t.startswith("tepo_lab") for t in targets)} == {}
    named = {name: _names_of_lab_modules(path.read_text()) for name, path in _modules().items()
             if name.split(".")[0] == "tepo_verl"}
    assert {name: found for name, found in named.items() if found} == {}
    # the other way is how the lab works: the reader sees imports across the two packages
    assert any(target.startswith("tepo_verl.") for name, targets in graph.items() if name.startswith("tepo_lab")
               for target in targets)


def test_the_import_reader_sees_every_form_of_import(tmp_path):
    """Absolute, relative (one and two levels up), `from package import module` and function-level imports each
    name the module imported; a name imported from a module names that module; outside names are dropped."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/d.py"):
        (package / name).write_text("")
    source = package / "sub" / "e.py"
    source.write_text("import os\nimport pkg.a\nfrom . import d\nfrom .. import b\nfrom ..c import NAME\n\n"
                      "def later():\n    from pkg.sub.d import thing\n")
    modules = {name: package / "x.py" for name in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d")}
    assert _imports(source.read_text(), "pkg.sub.e", False, modules) == {"pkg.a", "pkg.sub.d", "pkg.b", "pkg.c"}


def test_the_readers_see_imports_by_name_and_modules_named_in_strings():
    modules = {"p": None, "p.a": None, "p.b": None, "p.c": None, "tepo_lab.cpu": None}
    source = textwrap.dedent(
        """
        import importlib

        def f():
            __import__("p.a").a.go()
            importlib.import_module("p.b")
            from . import c
            '''tepo_lab.cpu in a docstring is prose, not a module name'''
            TABLE = {"x": "tepo_lab.cpu:main"}
        """)
    assert _imports(source, "p.m", False, modules) == {"p.a", "p.b", "p.c"}
    assert _names_of_lab_modules(source) == ["tepo_lab.cpu:main"]


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _circles({"p": set(), "p.m": {"p"}, "p.n": {"p.m"}}) == []  # a module importing its package


# ---- at run time: what `import verl` loads --------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import json, sys
    import verl
    loaded = sorted(sys.modules)
    from verl.trainer.ppo import core_algos
    print("PROBE " + json.dumps({
        "modules": loaded,
        "files": sorted({str(getattr(m, "__file__", None) or "") for m in list(sys.modules.values())}),
        "loss": core_algos.POLICY_LOSS_REGISTRY["tepo"].__module__,
        "estimator": core_algos.ADV_ESTIMATOR_REGISTRY["tepo"].__module__,
    }))
    """
)
#: What the plugin must not load: the lab, the report, the tools that have extras, the study.
NOT_LOADED = ("tepo_lab", "tepo_verl.report", "tepo_verl.data", "tepo_verl.evaluation", "tepo_verl.reward")
#: What `import verl` must load: TEPO's core, its adapter, and the presets' Hydra search path.
LOADED = ("tepo_verl.core.loss", "tepo_verl.core.mask", "tepo_verl.verl_adapter.plugin",
          "tepo_verl.verl_adapter.registry", "hydra_plugins.tepo_verl_searchpath")


def _import_verl(**env) -> dict:
    require_module("verl")
    full = {k: v for k, v in os.environ.items() if k not in ("TEPO_VERL_CPU", "VERL_USE_EXTERNAL_PLUGINS")} | env
    proc = fresh_python.run(["-c", PROBE], env=full)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("PROBE ")][-1][len("PROBE "):])


def _within(name: str, packages) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def test_import_verl_loads_tepo_and_nothing_of_the_lab_the_report_or_the_study():
    """A process with the plugin alone (verl loads the `tepo` entry point only, as where the lab is not installed)."""
    out = _import_verl(VERL_USE_EXTERNAL_PLUGINS="tepo")
    assert set(LOADED) <= set(out["modules"]), sorted(set(LOADED) - set(out["modules"]))
    assert out["loss"] == out["estimator"] == "tepo_verl.verl_adapter.registry"
    assert [name for name in out["modules"] if _within(name, NOT_LOADED)] == []
    assert [path for path in out["files"] if path.startswith(str(REPO / "benchmarks"))] == []


def test_with_the_lab_installed_import_verl_loads_only_its_cpu_hook():
    """Where `make` installed the lab too, its entry point adds its CPU-mode hook, which with TEPO_VERL_CPU unset
    loads nothing more (no platform, no patch, no tiny model, no demo)."""
    from tepo_lab.cpu import versions

    problem = versions.hook_problem(environ={})
    if problem is not None:
        skip_or_fail(problem)
    out = _import_verl()
    assert [name for name in out["modules"] if _within(name, NOT_LOADED)] == [
        "tepo_lab", "tepo_lab.cpu", "tepo_lab.cpu.entrypoint"]
    assert out["loss"] == "tepo_verl.verl_adapter.registry"
