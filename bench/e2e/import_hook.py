"""The one import hook of the benchmark-only start-up files (bench/e2e/*/sitecustomize.py, never shipped).

Why: the e2e harness changes a few things inside SGLang's own processes (the scheduler and its workers are started
by SGLang, not by us), and the only door into every one of them is a ``sitecustomize`` on PYTHONPATH. Each hook
needs the same thing: run a function on one of SGLang's modules right after that module's code has executed, and
touch nothing else. ``after_import`` puts a meta-path finder in front that finds the module the normal way (with
itself out of the way) and wraps its loader.

The hooks import this module as ``bench.e2e.import_hook``, so the repository root must be on PYTHONPATH in those
processes: bench/e2e/driver.py's ``config_env`` puts it there (after everything else) whenever it adds a hook
directory. ``chain_next_sitecustomize`` runs the ``sitecustomize`` further down the path that a hook shadows.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from types import ModuleType


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``patch(module)``."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec):
        return self.inner.create_module(spec) if hasattr(self.inner, "create_module") else None

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, targets: frozenset[str], patch: Callable[[ModuleType], None]) -> None:
        self.targets = targets
        self.patch = patch

    def find_spec(self, name, path, target=None):
        if name not in self.targets:
            return None
        sys.meta_path.remove(self)  # find it the normal way, without this finder
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.patch)
        return spec


def after_import(targets: str | Iterable[str], patch: Callable[[ModuleType], None]) -> None:
    """Call ``patch(module)`` right after each module named in ``targets`` is executed (first import only)."""
    names = frozenset([targets] if isinstance(targets, str) else targets)
    sys.meta_path.insert(0, _Finder(names, patch))


def chain_next_sitecustomize(this_file: str) -> None:
    """Run the next ``sitecustomize.py`` on sys.path after the directory of ``this_file`` (which shadows it)."""
    here = os.path.dirname(os.path.abspath(this_file))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", cand)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return
