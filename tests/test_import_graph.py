"""The package's imports run one way: no module of tepo_verl imports, directly or through others, a module that
imports it back (function-level imports count too). Read from the source with ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tepo_verl"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` (at path) imports: `from a.b import c` names a.b.c when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {target for target in out if target in modules and target != name}


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


def test_the_package_has_no_import_circle():
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    assert _circles(graph) == []


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
    assert _imports(source, "pkg.sub.e", modules) == {"pkg.a", "pkg.sub.d", "pkg.b", "pkg.c"}


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _circles({"p": set(), "p.m": {"p"}, "p.n": {"p.m"}}) == []  # a module importing its package
