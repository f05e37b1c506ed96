"""DDTree's SGLang plugin: registers the patch set's hooks with SGLang's own ``HookRegistry``.

The overlay declares this module's :func:`register` as an entry point of group ``sglang.srt.plugins`` (a small
``ddtree_sglang_plugin-<version>.dist-info`` beside the package) and carries the hook table beside this file
(``plugin_hooks.json``, generated from the patch set's ``hooks:`` list): target, hook type, implementation
(``module:function`` in this package, :mod:`.hooks`), and the sha256 of the target's definition in the base the
patch set was made for. SGLang's ``load_plugins()`` runs :func:`register` in each of its processes (the launcher
before it parses the server arguments, every scheduler before it builds its workers), then applies the hooks.

Before registering a hook, its target's definition is read from the file SGLang imports and hashed the way the
patch-set check hashes it (every line from the first decorator to the last, exactly as the file has them): a target
that changed since the overlay was built is not hooked, and recorded. SGLang's loader logs a plugin's exceptions and
carries on, so a missing hook would otherwise go unnoticed: :func:`require_applied`, called wherever DDTree turns on
(server-argument resolution, the worker's start), refuses to run DDTree in a process where any hook of the table is
not in place, naming each and why. With DDTree off the hooks change nothing.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)

TABLE = Path(__file__).with_name("plugin_hooks.json")
_loaded = False
_registered: dict[tuple[str, str], str] = {}  # (target, type) -> implementation
_refused: dict[tuple[str, str], str] = {}  # (target, type) -> why it was not registered


def table() -> Optional[dict[str, Any]]:
    """The hook table the overlay carries, or None (an overlay whose series has no hooks)."""
    if not TABLE.is_file():
        return None
    return json.loads(TABLE.read_text(encoding="utf-8"))


def register() -> None:
    """The entry point: check each target against its recorded hash, then register its hook."""
    global _loaded
    _loaded = True
    data = table()
    if data is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    root = _site_root()
    for h in data["hooks"]:
        key = (h["target"], h["type"])
        problem = _check(h, root)
        if problem is not None:
            _refused[key] = problem
            logger.error("DDTree: not hooking %s (%s): %s", h["target"], h["type"], problem)
            continue
        module, func = h["hook"].split(":", 1)
        HookRegistry.register(h["target"], getattr(importlib.import_module(module), func), HookType[h["type"].upper()])
        _registered[key] = h["hook"]


def require_applied(where: str) -> None:
    """Refuse DDTree (RuntimeError naming every hook and why) unless all of the table's hooks are in place here."""
    data = table()
    if data is None:
        return
    problems = []
    if not _loaded:
        problems.append("the ddtree plugin was not loaded in this process (SGLang's load_plugins() did not run it: "
                        "SGLANG_PLUGINS set without 'ddtree', or the overlay's ddtree_sglang_plugin dist-info not "
                        "on the path)")
    else:
        from sglang.srt.plugins.hook_registry import HookRegistry

        patched = getattr(HookRegistry, "_patched", set())
        for h in data["hooks"]:
            key = (h["target"], h["type"])
            if key in _refused:
                problems.append(f"{h['type']} {h['target']}: {_refused[key]}")
            elif key not in _registered:
                problems.append(f"{h['type']} {h['target']}: not registered")
            elif h["target"] not in patched:
                problems.append(f"{h['type']} {h['target']}: registered but not applied (SGLang logs why: "
                                f"'Failed to apply hooks to {h['target']}')")
    if problems:
        raise RuntimeError(f"DDTree (--speculative-ddtree-budget) cannot run ({where}, pid {os.getpid()}): its hooks "
                           "into SGLang are not in place: " + "; ".join(problems))


# -- the target check: the same reading of the base's files as ddtree_deploy.patchset.hooks -------------------------
def _site_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]).parent


def _module_file(root: Path, module: str) -> Optional[str]:
    stem = module.replace(".", "/")
    for cand in (f"{stem}.py", f"{stem}/__init__.py"):
        if (root / cand).is_file():
            return cand
    return None


def _find(tree: ast.Module, qual: list[str]) -> Optional[ast.AST]:
    body: list[ast.stmt] = tree.body
    node: Optional[ast.AST] = None
    for name in qual:
        found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == name]
        if not found:
            return None
        node = found[-1]
        body = node.body if isinstance(node, ast.ClassDef) else []
    return node


def _digest(text: str, node: ast.AST) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = text.splitlines(keepends=True)
    return hashlib.sha256("".join(lines[first - 1:node.end_lineno]).encode("utf-8")).hexdigest()


def _check(h: dict[str, Any], root: Path) -> Optional[str]:
    """Why ``h`` must not be registered in this installation, or None."""
    parts = h["target"].split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = _module_file(root, ".".join(parts[:i]))
        if path is not None:
            qual = parts[i:]
            break
    else:
        return f"no module file for {h['target']} under {root}"
    text = (root / path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    if h.get("source"):
        if _find(tree, qual) is not None:
            return f"{'.'.join(qual)} is now defined in {path} itself (hooked as inherited from {h['source']})"
        path, src_qual = h["source"].split("::", 1)
        if not (root / path).is_file():
            return f"{path} is missing"
        text = (root / path).read_text(encoding="utf-8")
        tree, qual = ast.parse(text), src_qual.split(".")
    node = _find(tree, qual)
    if node is None:
        return f"{'.'.join(qual)} is not defined in {path}"
    found = _digest(text, node)
    if found != h["sha256"]:
        return (f"its definition in {path} changed since the overlay was built (sha256 {found}, the patch set was "
                f"made against {h['sha256']})")
    return None
