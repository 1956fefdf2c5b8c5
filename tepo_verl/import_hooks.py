"""Post-import hooks: call a function on a module right after it is imported (at once if it already is).

The plugin patches verl modules this way (and the lab's CPU mode, verl's and vLLM's), so loading them imports none of
them in processes that never use them.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable

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
