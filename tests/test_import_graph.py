"""No import circle in the tool or in the code a patch set vendors: every import of ``ddtree_deploy/``,
``patches/ddtree/spec-v1/``, ``spec-v2/`` and ``runtime/`` read from its source (``ast``), and the graph searched for a
cycle: the module-level imports (as Python runs them at import time), and also those under ``if TYPE_CHECKING:`` and
inside functions (a lazy import is still a dependency a reader must follow). ``from pkg import sub`` counts as an
import of the module ``pkg.sub`` (not of ``pkg``); a module a registry names as text (``importlib``) is not an edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if "__pycache__" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path], *, typing: bool = False,
             functions: bool = False) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not functions:
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and not typing:
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                subs = [f"{target}.{a.name}" for a in child.names]
                found.update(s for s in subs if s in modules)
                if not all(s in modules for s in subs):
                    found.add(target)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in modules and m != name}


def cycles(root: Path, *, typing: bool = False, functions: bool = False) -> list[list[str]]:
    """The import cycles among the modules under ``root`` (each as the modules on it, sorted); ``typing`` and
    ``functions`` add the imports for type checkers and those inside functions."""
    modules = _modules(root)
    graph = {m: _imports(p, m, modules, typing=typing, functions=functions) for m, p in modules.items()}
    found, done = [], set()
    for start in sorted(graph):
        stack, path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                path.pop()
                continue
            if nxt == start:
                cyc = sorted(path)
                if tuple(cyc) not in done:
                    done.add(tuple(cyc))
                    found.append(cyc)
            elif nxt not in path and nxt > start:  # each cycle found once, from its smallest module
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return found


@pytest.mark.parametrize("root", ["ddtree_deploy", "patches/ddtree/spec-v1", "patches/ddtree/spec-v2", "patches/ddtree/runtime"])
def test_no_import_circle_at_import_time(root: str) -> None:
    assert cycles(REPO / root) == []


@pytest.mark.parametrize("root", ["ddtree_deploy", "patches/ddtree/spec-v1", "patches/ddtree/spec-v2", "patches/ddtree/runtime"])
def test_no_import_circle_even_through_types_and_functions(root: str) -> None:
    assert cycles(REPO / root, typing=True, functions=True) == []


def test_the_probe_and_the_baseline_do_not_import_each_other_even_for_types() -> None:
    """``probe`` names the baseline's path through ``hoststate``; ``baseline`` uses the probe (for types only)."""
    assert not [c for c in cycles(REPO / "ddtree_deploy", typing=True)
                if any(m.startswith("ddtree_deploy.probe") for m in c) and "ddtree_deploy.baseline" in c]


def test_the_checker_sees_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n"
                              "def f():\n    from . import a\n")
    (pkg / "d.py").write_text("from .c import z\n")
    assert cycles(pkg) == [["pkg.a", "pkg.b"]]
    (pkg / "a.py").write_text("from .d import w\n")
    assert cycles(pkg) == [] and cycles(pkg, typing=True) == [["pkg.a", "pkg.c", "pkg.d"]]
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    assert cycles(pkg, typing=True) == [] and cycles(pkg, functions=True) == [["pkg.a", "pkg.c", "pkg.d"]]
