"""Hooks: changes a patch set delivers through SGLang's own plugin framework instead of text patches.

SGLang (0.5.14 and later) loads the entry points of group ``sglang.srt.plugins`` in every server process (the
launcher before it parses the server arguments, each scheduler before it builds its workers, the detokenizer, the
data-parallel controller), and ``sglang.srt.plugins.hook_registry.HookRegistry`` wraps any function, method or class
by its qualified name (``before`` / ``after`` / ``around`` / ``replace``). A patch set's ``hooks:`` list names, per
hook, the target, the hook type, the implementation (a function in the patch set's vendored code) and the sha256 of
the target's source in the base, so a hook is as exact as a hunk: :func:`check_hooks` locates every target in the
base's files by AST (no SGLang import) and a target that is missing or whose source changed is reported like a
failed hunk (exit 5, naming the target, the file and both hashes; :mod:`.plugin` does it for a whole patch set).

The source of a target is the exact text of its definition: every line from its first decorator (or its ``def`` /
``class`` line) to its last, as the base file has them, UTF-8 (:func:`definition_text`). A method the target class
inherits is named with ``source: FILE::Qualified.name`` (where it is defined); the target class must then still not
define it itself.

What the overlay adds for them (:func:`.plugin.plugin_files`): a small distribution, ``<name>_<package>_plugin-<version>.dist-info``
(``METADATA``, ``entry_points.txt`` with the ``sglang.srt.plugins`` entry point), beside the package in the release
(``PYTHONPATH=<root>/current`` puts it on the path of every server process), and the hook table the entry point
registers from (``plugin.hooks_file``, JSON: target, type, implementation, sha256, source), which the vendored
plugin re-checks against the host's own files before it registers anything.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import InputError

HOOK_TYPES = ("before", "after", "around", "replace")
#: The entry-point group SGLang's plugin loader reads (``sglang.srt.plugins.GENERAL_PLUGINS_GROUP``).
ENTRY_POINT_GROUP = "sglang.srt.plugins"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_IMPL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_SOURCE = re.compile(r"^([^:]+\.py)::([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$")


@dataclass(frozen=True)
class Hook:
    """One entry of ``hooks:``."""

    index: int
    target: str  # what HookRegistry gets: sglang.srt.arg_groups.speculative_hook._handle_dflash
    type: str  # before | after | around | replace
    hook: str  # the implementation: module:function, in the patch set's vendored code
    sha256: str  # of the target's definition text in the base
    source: Optional[str] = None  # FILE::Qualified.name where an inherited target is defined
    why: str = ""

    @property
    def label(self) -> str:
        return f"hooks[{self.index}] ({self.type} {self.target})"


@dataclass(frozen=True)
class Plugin:
    """``plugin:``: the entry point the overlay's dist-info declares, and where the hook table goes."""

    name: str  # the entry point's name (what SGLANG_PLUGINS whitelists)
    entry: str  # module:function that registers the hooks
    hooks_file: str  # overlay path of the generated hook table (JSON)


def check_hook_fields(raw: dict[str, Any], idx: int, src: str) -> Hook:
    """A ``hooks:`` entry already validated by the schema, checked for what the schema cannot say."""
    where = f"{src}: field 'hooks[{idx}]"
    target = raw["target"]
    if not _DOTTED.match(target):
        raise InputError(f"{where}.target': {target!r} is not a qualified name (module.function, module.Class.method)")
    if raw["type"] not in HOOK_TYPES:
        raise InputError(f"{where}.type': {raw['type']!r} is not one of {', '.join(HOOK_TYPES)}")
    if not _IMPL.match(raw["hook"]):
        raise InputError(f"{where}.hook': {raw['hook']!r} is not module:function")
    if not re.match(r"^[0-9a-f]{64}$", raw["sha256"] or ""):
        raise InputError(f"{where}.sha256': expected a sha256 hex digest (64 lower-case hex characters), got "
                         f"{raw['sha256']!r} (`patchset port` writes it)")
    source = raw.get("source")
    if source is not None and not _SOURCE.match(source):
        raise InputError(f"{where}.source': {source!r} is not FILE.py::Qualified.name")
    return Hook(index=idx, target=target, type=raw["type"], hook=raw["hook"], sha256=raw["sha256"], source=source,
                why=raw.get("why") or "")


# -- locating a target in the base ---------------------------------------------------------------------------------
def module_file(module: str, has: Callable[[str], bool]) -> Optional[str]:
    stem = module.replace(".", "/")
    for cand in (f"{stem}.py", f"{stem}/__init__.py"):
        if has(cand):
            return cand
    return None


def split_target(target: str, has: Callable[[str], bool]) -> tuple[Optional[str], list[str]]:
    """(the module's file, the qualified name inside it): the longest module prefix the base has a file for."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = module_file(".".join(parts[:i]), has)
        if path is not None:
            return path, parts[i:]
    return None, []


def find_definition(tree: ast.Module, qual: list[str]) -> Optional[ast.AST]:
    """The ``def`` / ``class`` named by ``qual`` (module-level, then class bodies); the last one where a body
    defines a name twice (what the name is bound to once the body ran)."""
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


def definition_text(text: str, node: ast.AST) -> str:
    """Every line of the definition, from its first decorator to its last line, exactly as the file has them."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = text.splitlines(keepends=True)
    return "".join(lines[first - 1:node.end_lineno])


@dataclass(frozen=True)
class Located:
    file: Optional[str]  # the file whose definition is hashed
    found: Optional[str]  # its sha256, or None
    problem: Optional[str]  # why the target cannot be hooked in this base


def locate(hook: Hook, has: Callable[[str], bool], read: Callable[[str], bytes]) -> Located:
    """Where ``hook``'s target is in a base (``has`` / ``read`` over site-packages paths) and its sha256 there."""
    cache: dict[str, tuple[str, ast.Module]] = {}

    def parsed(path: str) -> tuple[str, ast.Module]:
        if path not in cache:
            text = read(path).decode("utf-8")
            cache[path] = (text, ast.parse(text, filename=path))
        return cache[path]

    target_file, qual = split_target(hook.target, has)
    if target_file is None:
        return Located(None, None, f"no module file for {hook.target} in the base")
    text, tree = parsed(target_file)
    if hook.source is None:
        node = find_definition(tree, qual)
        if node is None:
            return Located(target_file, None, f"{'.'.join(qual)} is not defined in {target_file}")
        return Located(target_file, digest(text, node), None)
    # an inherited target: its class is in the target's file, the definition where ``source`` says
    if len(qual) < 2 or not isinstance(find_definition(tree, qual[:-1]), ast.ClassDef):
        return Located(target_file, None, f"class {'.'.join(qual[:-1])} is not defined in {target_file}")
    if find_definition(tree, qual) is not None:
        return Located(target_file, None, f"{'.'.join(qual)} is now defined in {target_file} itself (the hook was "
                       f"made for the one it inherits, {hook.source})")
    src_file, src_qual = hook.source.split("::", 1)
    if not has(src_file):
        return Located(src_file, None, f"{src_file} (the source of {hook.target}) is not in the base")
    stext, stree = parsed(src_file)
    node = find_definition(stree, src_qual.split("."))
    if node is None:
        return Located(src_file, None, f"{src_qual} is not defined in {src_file}")
    return Located(src_file, digest(stext, node), None)


def digest(text: str, node: ast.AST) -> str:
    """The sha256 of a definition's exact text (:func:`definition_text`): what a ``hooks:`` entry records."""
    return hashlib.sha256(definition_text(text, node).encode("utf-8")).hexdigest()
