"""Writing values back into a host file without disturbing the rest of it (comments, order, quoting, folding).

``tune`` writes the schedule it chose into ``server.ddtree_flags``; ``apply --fix-flags`` writes the new spelling
of flags SGLang renamed into ``server.command`` / ``server.ddtree_flags`` (launch_check.renamed_in). The file goes
through a ruamel.yaml round trip (comments, key order, quoting and a folded ``>-`` value's line breaks are kept);
the edited text is then parsed and validated as a host file and must give exactly the intended flags with nothing
else changed; otherwise nothing is written and the error says what to change by hand. The file is replaced
atomically, keeping its mode.
"""
from __future__ import annotations

import difflib
import io
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError as RuamelError
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, FoldedScalarString, SingleQuotedScalarString

from .errors import InputError
from .inventory import Host, load_host_file
from .schema import load_yaml
from .spec_flags import with_budget


def _round_trip() -> YAML:
    rt = YAML(typ="rt")
    rt.preserve_quotes = True
    rt.width = 4096  # never re-fold a long line the user wrote on one line
    return rt


def _like(old: Any, value: str) -> Any:
    """``value`` written the way ``old`` was: same quotes; a folded value keeps its line breaks before the change."""
    if isinstance(old, FoldedScalarString):
        new = FoldedScalarString(value)
        common = len(os.path.commonprefix([str(old), value]))
        new.fold_pos = [p for p in getattr(old, "fold_pos", []) if p < common]
        return new
    for kind in (SingleQuotedScalarString, DoubleQuotedScalarString):
        if isinstance(old, kind):
            return kind(value)
    return value


def _edit(text: str, want: dict[str, str]) -> str | None:
    """The host file's text with each ``server.<key>`` of ``want`` set to its value, or None when it has no server
    mapping.

    ruamel.yaml writes the edited document; a file it would not write back byte for byte (a long quoted value
    folded over lines, other indentation) gets only the lines of the entries replaced: the change between ruamel's
    rendering before and after the edit, spliced into the file where those lines stand."""
    rt = _round_trip()
    doc = rt.load(text)
    server = doc.get("server") if isinstance(doc, CommentedMap) else None
    if not isinstance(server, CommentedMap):
        return None
    before = _dump(rt, doc)
    for key, value in want.items():
        server[key] = _like(server.get(key), value)
    after = _dump(rt, doc)
    return after if before == text else _splice(text, before, after)


def _dump(rt: YAML, doc: Any) -> str:
    buf = io.StringIO()
    rt.dump(doc, buf)
    return buf.getvalue()


def _splice(text: str, before: str, after: str) -> str:
    """``text`` with the lines that differ between ``before`` and ``after`` replaced, found where they stand in
    ``text`` (the changed lines themselves, else with a line of context on each side, for an added entry); where
    they are not found exactly once, ``after`` whole. A trailing comment keeps the spacing it had."""
    old, new, lines = before.splitlines(True), after.splitlines(True), text.splitlines(True)
    changes = [op for op in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not changes:
        return text
    i1, i2, j1, j2 = changes[0][1], changes[-1][2], changes[0][3], changes[-1][4]
    for lo, hi in ((i1, i2), (max(0, i1 - 1), min(len(old), i2 + 1))):
        needle = old[lo:hi]
        spots = [k for k in range(len(lines) - len(needle) + 1) if needle and lines[k:k + len(needle)] == needle]
        if len(spots) == 1:
            k = spots[0]
            block = _keep_comment_gap(old[i1:i2], new[j1:j2])
            return "".join(lines[:k] + old[lo:i1] + block + old[i2:hi] + lines[k + len(needle):])
    return after


_COMMENT = re.compile(r"(?P<gap>[ \t]+)(?P<comment>#[^'\"\n]*)$")


def _keep_comment_gap(old: list[str], new: list[str]) -> list[str]:
    """ruamel puts a comment one space after a value that grew; keep the gap the file had before it."""
    if len(old) != 1 or len(new) != 1:
        return new
    a, b = _COMMENT.search(old[0].rstrip("\n")), _COMMENT.search(new[0].rstrip("\n"))
    if not a or not b or a["comment"] != b["comment"]:
        return new
    line = new[0].rstrip("\n")
    return [line[:b.start()] + a["gap"] + b["comment"] + new[0][len(line):]]


def _without(doc: object, keys: set[str]) -> object:
    if isinstance(doc, dict) and isinstance(doc.get("server"), dict):
        return {**doc, "server": {k: v for k, v in doc["server"].items() if k not in keys}}
    return doc


def plan_server_edit(host: Host, want: dict[str, str]) -> tuple[str, str, str]:
    """(old text, new text, unified diff) of setting the host file's ``server.<key>`` fields to ``want``; InputError
    naming the file and field when the file cannot be edited safely (the edit must give exactly those values, as
    words of a command line, and change nothing else)."""
    path = Path(host.source)
    fields = ", ".join(f"'server.{k}'" for k in want)
    manual = "set " + "; ".join(f"server.{k} to {v!r}" for k, v in want.items()) + " by hand"
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the host file: {exc}") from None
    try:
        new = _edit(text, want)
    except RuamelError as exc:
        raise InputError(f"{path}: field {fields}: cannot edit the file: {' '.join(str(exc).split())}",
                         hint=manual) from None
    if new is None:
        raise InputError(f"{path}: field 'server': expected a mapping to write {', '.join(want)} into", hint=manual)
    try:
        old_doc, new_doc = load_yaml(text), load_yaml(new)
    except yaml.YAMLError:
        raise InputError(f"{path}: editing field {fields} would break the YAML", hint=manual) from None
    server = (new_doc or {}).get("server") or {}
    exact = all(shlex.split(str(server.get(k) or "")) == shlex.split(v) for k, v in want.items())
    if not exact or _without(old_doc, set(want)) != _without(new_doc, set(want)):
        raise InputError(f"{path}: field {fields}: the edit did not give exactly the intended value (or changed "
                         "another field)", hint=manual)
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(path), str(path)))
    return text, new, diff


def plan_budget_edit(host: Host, budget: str) -> tuple[str, str, str]:
    """(old text, new text, unified diff) of setting the host file's DDTree budget to ``budget``."""
    return plan_server_edit(host, {"ddtree_flags": with_budget(str(host.server.get("ddtree_flags") or ""), budget)})


def write_host_file(host: Host, text: str) -> Host:
    """Replace the host file atomically (same directory, same mode) and load it back as a validated host."""
    path = Path(host.source)
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix="ddtree-tune-", suffix=".tmp", dir=path.parent)  # a valid host-name stem
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        try:
            load_host_file(Path(tmp))  # the edited file must still be a valid host file before it replaces the old one
        except InputError as exc:  # named as the file the user has, not the temporary one
            raise InputError(exc.message.replace(tmp, f"{path} (as edited)"), hint=exc.hint) from None
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return load_host_file(path)
