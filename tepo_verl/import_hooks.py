"""How tepo-verl changes another package's code, in one place: `replace` (the one way to replace a function and
keep the original) and `when_imported` (a post-import hook: call a function on a module right after it is
imported, at once if it already is).

Every replacement keeps the function it replaced as its `__tepo_stock__` (`stock(f)` reads it), and replacing again
wraps that original, never a wrapper: installing twice is installing once. Post-import hooks let a patch (the
plugin's, and the lab's CPU mode's on verl and vLLM) wait for its module, so loading the plugin imports none of them
in processes that never use them; the finder they need sits in `sys.meta_path` only while a hook waits for its
module.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

#: The attribute under which a replacement keeps the function it replaced.
STOCK = "__tepo_stock__"


def _function(value: Any) -> Any:
    """A classmethod's or staticmethod's function; any other value itself."""
    return value.__func__ if isinstance(value, classmethod | staticmethod) else value


def stock(value: Any) -> Any:
    """The original behind a tepo-verl replacement (for a classmethod or staticmethod: its function); a value that
    replaces nothing is its own original."""
    function = _function(value)
    return getattr(function, STOCK, function)


def is_replaced(value: Any) -> bool:
    return stock(value) is not _function(value)


def _current(owner: Any, name: str) -> Any:
    """owner.name as stored: a class's own attribute (so a classmethod stays a classmethod), a module's global."""
    if isinstance(owner, type):
        if name not in owner.__dict__:
            raise AttributeError(f"{owner.__qualname__} defines no {name} of its own; nothing to replace")
        return owner.__dict__[name]
    return getattr(owner, name)


def replace(owner: Any, name: str, make: Callable[[Callable], Callable], *,
            also_in: Iterable[ModuleType] = ()) -> Callable:
    """Set `owner.name` (a module's function, a class's method) to `make(original)` and return the replacement.

    `original` is what `owner.name` was before any tepo-verl replacement, so replacing twice wraps the original
    once. The replacement keeps it as `__tepo_stock__`. A classmethod or staticmethod stays one: `make` gets and
    returns the plain function. Modules in `also_in` that bound the original by name (`from m import name`) are
    rebound to the replacement; a module that binds something else is left alone.
    """
    current = _current(owner, name)
    original = stock(current)
    replacement = make(original)
    setattr(replacement, STOCK, original)
    kind = type(current) if isinstance(current, classmethod | staticmethod) else None
    setattr(owner, name, kind(replacement) if kind else replacement)
    for module in also_in:
        if name in vars(module) and stock(vars(module)[name]) is original:
            setattr(module, name, replacement)
    return replacement


def restore(owner: Any, name: str, *, also_in: Iterable[ModuleType] = ()) -> None:
    """Undo `replace`: `owner.name` (and the names in `also_in` that bind the replacement) is the original again."""
    current = _current(owner, name)
    original = stock(current)
    kind = type(current) if isinstance(current, classmethod | staticmethod) else None
    for module in also_in:
        if name in vars(module) and vars(module)[name] is _function(current):
            setattr(module, name, original)
    setattr(owner, name, kind(original) if kind else original)


# ------------------------------------------------------------------ post-import hooks

_HOOKS: dict[str, list[Callable]] = {}
_LOCK = threading.RLock()


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs the hooks registered for a module right after the module executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module") or getattr(loader, "__tepo_hooked__", False):
            return spec
        spec.loader = _HookedLoader(loader)
        return spec


class _HookedLoader(importlib.abc.Loader):
    __tepo_hooked__ = True

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader  # the module looks as if imported normally
        _run_hooks(module.__name__, module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self._loader, name)


_FINDER = _PostImportFinder()


def _run_hooks(name: str, module) -> None:
    with _LOCK:
        hooks = _HOOKS.pop(name, [])
        if not _HOOKS and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)  # nothing waits any more: the import system is as it was
    for hook in hooks:
        hook(module)


def when_imported(name: str, hook: Callable) -> None:
    """Call hook(module) once `name` is imported: now if it already is, else right after its import."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is None:
            _HOOKS.setdefault(name, []).append(hook)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    hook(module)
