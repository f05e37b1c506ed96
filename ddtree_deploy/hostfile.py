"""Writing one value back into a host file without disturbing the rest of it (comments, order, quoting, folding).

``tune`` writes the schedule it chose into ``server.ddtree_flags``. A YAML round trip through a parser would drop
the comments people keep in these files, so the edit is textual: the budget's value token is replaced where it is
written (or, for a one-line ``ddtree_flags:``, the flag is appended), then the edited text is parsed and validated as
a host file and must give exactly the intended flags with nothing else changed; otherwise nothing is written and the
error says what to change by hand. The file is replaced atomically, keeping its mode.
"""
from __future__ import annotations

import difflib
import os
import re
import shlex
import tempfile
from pathlib import Path

import yaml

from .errors import InputError
from .inventory import Host, load_host_file
from .spec_flags import BUDGET_FLAGS, budget_of, with_budget

_BUDGET_RE = re.compile(r"(?P<flag>" + "|".join(re.escape(f) for f in BUDGET_FLAGS) + r")(?P<sep>[ =]+)(?P<value>[^\s'\"#]+)")
_FLAGS_LINE_RE = re.compile(r"^(?P<head>\s*ddtree_flags:[ \t]+)(?P<value>[^|>#\n][^#\n]*?)(?P<tail>[ \t]+#.*)?$", re.M)


def _edit(text: str, old_flags: str, budget: str) -> str | None:
    hits = list(_BUDGET_RE.finditer(text))
    if budget_of(old_flags) is not None:
        if len(hits) != 1:
            return None
        m = hits[0]
        return text[:m.start("value")] + budget + text[m.end("value"):]
    lines = list(_FLAGS_LINE_RE.finditer(text))
    if len(lines) != 1:
        return None
    m = lines[0]
    value = m.group("value").rstrip()
    if value[-1:] in ("'", '"') and value[:1] == value[-1:]:
        new_value = value[:-1] + f" {BUDGET_FLAGS[0]} {budget}" + value[-1]
    else:
        new_value = value + f" {BUDGET_FLAGS[0]} {budget}"
    return text[:m.start("value")] + new_value + text[m.start("value") + len(value):]


def _without_flags(doc: object) -> object:
    if isinstance(doc, dict) and isinstance(doc.get("server"), dict):
        return {**doc, "server": {k: v for k, v in doc["server"].items() if k != "ddtree_flags"}}
    return doc


def plan_budget_edit(host: Host, budget: str) -> tuple[str, str, str]:
    """(old text, new text, unified diff) of setting the host file's DDTree budget to ``budget``; InputError naming
    the file and field when the file cannot be edited safely."""
    path = Path(host.source)
    old_flags = str(host.server.get("ddtree_flags") or "")
    want = with_budget(old_flags, budget)
    manual = f"set server.ddtree_flags to {want!r} by hand"
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the host file: {exc}") from None
    new = _edit(text, old_flags, budget)
    if new is None:
        raise InputError(f"{path}: field 'server.ddtree_flags': cannot find the one place to write the budget "
                         f"(the budget flag must appear once in the file, or ddtree_flags be one line)", hint=manual)
    try:
        old_doc, new_doc = yaml.safe_load(text), yaml.safe_load(new)
    except yaml.YAMLError:
        raise InputError(f"{path}: editing field 'server.ddtree_flags' would break the YAML", hint=manual) from None
    got = str(((new_doc or {}).get("server") or {}).get("ddtree_flags") or "")
    if shlex.split(got) != shlex.split(want) or _without_flags(old_doc) != _without_flags(new_doc):
        raise InputError(f"{path}: field 'server.ddtree_flags': the textual edit did not give exactly the intended "
                         "flags", hint=manual)
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(path), str(path)))
    return text, new, diff


def write_host_file(host: Host, text: str) -> Host:
    """Replace the host file atomically (same directory, same mode) and load it back as a validated host."""
    path = Path(host.source)
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix="ddtree-tune-", suffix=".tmp", dir=path.parent)  # a valid host-name stem
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        load_host_file(Path(tmp))  # the edited file must still be a valid host file before it replaces the old one
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return load_host_file(path)
