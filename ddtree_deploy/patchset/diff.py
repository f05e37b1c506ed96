"""The diff parser: a git or plain unified diff, read into hunks, refusing what an overlay cannot be.

An overlay only adds or replaces regular files inside one package, so a patch that creates a symlink or a submodule,
is binary, deletes, renames or copies a file, or names a path outside the package (``../``, absolute, ``.git``) is
refused here, naming the patch file and the line. ``format`` calls it for every series entry; ``apply`` and ``dev``
act on the hunks it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import InputError
from ..overlay import check_relative_path, is_plugin_dist_info

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
MODE_FILE, MODE_EXEC, MODE_SYMLINK, MODE_GITLINK = "100644", "100755", "120000", "160000"


# -- parsed patches ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk: its header and raw lines (each still carrying its ' ', '-', '+' or '\\' prefix)."""

    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]

    @property
    def expected(self) -> list[str]:
        """The lines the base must contain for this hunk to apply (context and removed lines, prefix stripped)."""
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    @property
    def added(self) -> int:
        return sum(1 for ln in self.lines if ln.startswith("+"))

    @property
    def removed(self) -> int:
        return sum(1 for ln in self.lines if ln.startswith("-"))


@dataclass(frozen=True)
class FilePatch:
    """The part of a patch that changes one file (paths relative to site-packages, ``a/``/``b/`` stripped)."""

    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    old_mode: str | None = None
    new_mode: str | None = None
    new_file: bool = False
    deleted: bool = False
    renamed: bool = False
    copied: bool = False
    binary: bool = False
    index_old: str | None = None  # preimage blob id from the ``index`` line (used by --3way)
    index_new: str | None = None
    hunks: tuple[Hunk, ...] = ()

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def result_mode(self) -> str | None:
        """The git mode the file has after this patch, when the patch says so."""
        return self.new_mode


@dataclass(frozen=True)
class PatchFile:
    """One entry of the series: its name, where it lives, its subject line and the files it changes."""

    name: str
    path: Path
    subject: str
    files: tuple[FilePatch, ...]
    is_mbox: bool  # written by `git format-patch` (has a "From <sha>" line and mail headers)
    # lifecycle (the series entry's optional fields): base versions it is for (a PEP 440 specifier), the patch
    # of the series that replaces it, the first base release that contains its change
    applies_to: str = ""
    superseded_by: str = ""
    upstream_merged: str = ""

    @property
    def touched(self) -> list[str]:
        return [f.path for f in self.files]

    def stat(self) -> tuple[int, int]:
        return (sum(h.added for f in self.files for h in f.hunks), sum(h.removed for f in self.files for h in f.hunks))


def parse_patch(text: str, *, source: str, package: str) -> tuple[str, tuple[FilePatch, ...], bool]:
    """Parse a git or plain unified diff; return (subject, file patches, is_mbox). Refuses what an overlay can't be.

    ``source`` names the patch file in every error. Only what ``git apply -p1`` would act on is parsed: the mail
    header and prose before the first diff, and the signature after the last hunk, are skipped.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # mail form: `git format-patch` output ("From <sha> <date>") or a bare mail header ("From: …", "Subject: …")
    is_mbox = bool(lines) and any(ln.startswith("Subject:") for ln in lines[:40]) and (
        lines[0].startswith(("From ", "From:", "Subject:", "Date:")))
    subject = _subject(lines)
    files: list[FilePatch] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if line.startswith("diff --git "):
            fp, i = _parse_git_file(lines, i, source=source, package=package)
            files.append(fp)
        elif line.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ "):
            old = _strip_prefix(lines[i][4:], "a/", source=source, lineno=i + 1)
            new = _strip_prefix(lines[i + 1][4:], "b/", source=source, lineno=i + 2)
            hunks, i = _parse_hunks(lines, i + 2, source=source)
            files.append(FilePatch(old_path=old, new_path=new, new_file=old is None, deleted=new is None, hunks=hunks))
        elif line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            raise InputError(f"{source}: line {i + 1}: binary patches are refused (ship files through runtime instead)")
        else:
            i += 1
    if not files:
        raise InputError(f"{source}: contains no diff (expected `diff --git a/... b/...` sections)")
    seen: set[str] = set()
    for fp in files:
        _check_file_patch(fp, source=source, package=package)
        if fp.path in seen:
            raise InputError(f"{source}: changes {fp.path} twice; one patch must change each file in one section")
        seen.add(fp.path)
    return subject, tuple(files), is_mbox


def _subject(lines: list[str]) -> str:
    for idx, line in enumerate(lines[:60]):
        if line.startswith("Subject:"):
            text = line[len("Subject:"):].strip()
            j = idx + 1
            while j < len(lines) and lines[j].startswith((" ", "\t")):  # folded header
                text += " " + lines[j].strip()
                j += 1
            return re.sub(r"^(\[PATCH[^\]]*\]\s*)", "", text)
        if line.startswith("Description:"):
            return line[len("Description:"):].strip()
        if line.startswith("diff --git ") or line.startswith("--- "):
            break
    for line in lines:
        if line.strip() and not line.startswith(("From ", "diff --git", "--- ", "index ")):
            return line.strip()
        if line.startswith(("diff --git", "--- ")):
            break
    return ""


def _strip_prefix(raw: str, prefix: str, *, source: str, lineno: int) -> str | None:
    name = raw.split("\t", 1)[0].rstrip()
    if name.startswith('"'):
        raise InputError(f"{source}: line {lineno}: quoted path {name} refused (unusual characters in a file name)")
    if name == "/dev/null":
        return None
    if not name.startswith(prefix):
        raise InputError(f"{source}: line {lineno}: path {name!r} lacks the '{prefix}' prefix (patches apply with -p1)")
    return name[len(prefix):]


def _parse_git_file(lines: list[str], i: int, *, source: str, package: str) -> tuple[FilePatch, int]:
    header = lines[i]
    rest = header[len("diff --git "):]
    if rest.startswith('"'):
        raise InputError(f"{source}: line {i + 1}: quoted path refused (unusual characters in a file name)")
    if re.search(r"(^|[ /])\.\.(/|$| )", rest) or re.search(r"(^|\s)[ab]//", rest):
        raise InputError(f"{source}: line {i + 1}: {header!r}: patched file path leaves the {package} package ('..' or absolute)")
    info: dict[str, Any] = {}
    # `a/P b/P` when the name did not change (also the only name source for mode-only changes).
    if rest.startswith("a/") and (len(rest) - 5) % 2 == 0:
        half = (len(rest) - 5) // 2
        p = rest[2:2 + half]
        if rest == f"a/{p} b/{p}":
            info["old_path"] = info["new_path"] = p
    i += 1
    n = len(lines)
    while i < n and not lines[i].startswith(("diff --git ", "@@ ")):
        line = lines[i]
        if line.startswith("--- "):
            info["old_path"] = _strip_prefix(line[4:], "a/", source=source, lineno=i + 1)
        elif line.startswith("+++ "):
            info["new_path"] = _strip_prefix(line[4:], "b/", source=source, lineno=i + 1)
        elif line.startswith("old mode "):
            info["old_mode"] = line.split()[-1]
        elif line.startswith("new mode "):
            info["new_mode"] = line.split()[-1]
        elif line.startswith("new file mode "):
            info["new_mode"] = line.split()[-1]
            info["new_file"] = True
        elif line.startswith("deleted file mode "):
            info["old_mode"] = line.split()[-1]
            info["deleted"] = True
        elif line.startswith(("rename from ", "rename to ")):
            info["renamed"] = True
        elif line.startswith(("copy from ", "copy to ")):
            info["copied"] = True
        elif line.startswith("index "):
            parts = line.split()
            if ".." in parts[1]:
                info["index_old"], info["index_new"] = parts[1].split("..", 1)
            if len(parts) > 2:
                info.setdefault("old_mode", parts[2])
                info.setdefault("new_mode", parts[2])
        elif line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            info["binary"] = True
        elif line.startswith(("similarity index", "dissimilarity index")):
            pass
        elif not line.strip() or line.startswith("-- "):
            break  # end of a mode-only section (blank line or format-patch signature)
        else:
            break
        i += 1
    if info.get("new_file"):
        info["old_path"] = None
    if info.get("deleted"):
        info["new_path"] = None
    hunks: tuple[Hunk, ...] = ()
    if i < n and lines[i].startswith("@@ "):
        hunks, i = _parse_hunks(lines, i, source=source)
    if "old_path" not in info and "new_path" not in info and not info.get("renamed") and not info.get("copied"):
        raise InputError(f"{source}: line {i + 1}: cannot read the file name from {header!r}")
    fp = FilePatch(old_path=info.get("old_path"), new_path=info.get("new_path"), old_mode=info.get("old_mode"),
                   new_mode=info.get("new_mode"), new_file=bool(info.get("new_file")), deleted=bool(info.get("deleted")),
                   renamed=bool(info.get("renamed")), copied=bool(info.get("copied")), binary=bool(info.get("binary")),
                   index_old=info.get("index_old"), index_new=info.get("index_new"), hunks=hunks)
    return fp, i


def _parse_hunks(lines: list[str], i: int, *, source: str) -> tuple[tuple[Hunk, ...], int]:
    hunks: list[Hunk] = []
    n = len(lines)
    while i < n and lines[i].startswith("@@ "):
        m = _HUNK.match(lines[i])
        if not m:
            raise InputError(f"{source}: line {i + 1}: malformed hunk header {lines[i]!r}")
        old_start, new_start = int(m.group(1)), int(m.group(3))
        old_count = int(m.group(2)) if m.group(2) is not None else 1
        new_count = int(m.group(4)) if m.group(4) is not None else 1
        header_line = i + 1
        body: list[str] = []
        i += 1
        old_left, new_left = old_count, new_count
        while i < n and (old_left > 0 or new_left > 0):
            line = lines[i]
            tag = line[:1]
            if tag == " " or line == "":  # some editors strip the space of an empty context line
                old_left -= 1
                new_left -= 1
                line = line or " "
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            elif tag == "\\":
                pass
            else:
                raise InputError(f"{source}: line {i + 1}: hunk starting at line {header_line} is shorter than its "
                                 f"header says ({lines[header_line - 1]})")
            body.append(line)
            i += 1
        if old_left or new_left:
            raise InputError(f"{source}: line {header_line}: hunk {lines[header_line - 1]} is truncated")
        while i < n and lines[i].startswith("\\"):
            body.append(lines[i])
            i += 1
        hunks.append(Hunk(header=lines[header_line - 1], old_start=old_start, old_count=old_count,
                          new_start=new_start, new_count=new_count, lines=tuple(body)))
    return tuple(hunks), i


def _check_file_patch(fp: FilePatch, *, source: str, package: str) -> None:
    for p in {fp.old_path, fp.new_path} - {None}:
        check_path_in_package(p, package, what=f"{source}: patched file")  # type: ignore[arg-type]
    for mode in (fp.old_mode, fp.new_mode):
        if mode == MODE_SYMLINK:
            raise InputError(f"{source}: {fp.path}: symlinks (mode 120000) are refused: a patch may only change "
                             "regular files inside the package")
        if mode == MODE_GITLINK:
            raise InputError(f"{source}: {fp.path}: submodules (mode 160000) are refused")
        if mode is not None and mode not in (MODE_FILE, MODE_EXEC):
            raise InputError(f"{source}: {fp.path}: unsupported file mode {mode} (expected 100644 or 100755)")
    if fp.binary:
        raise InputError(f"{source}: {fp.path}: binary patches are refused (ship files through runtime instead)")
    if fp.deleted:
        raise InputError(f"{source}: {fp.path}: deleting a file is refused: an overlay can only add or replace files "
                         "(empty it or make it raise instead)")
    if fp.renamed or fp.copied:
        raise InputError(f"{source}: {fp.path}: renames and copies are refused: an overlay can only add or replace "
                         "files (add the new file as a new file)")


def check_path_in_package(path: str, package: str, *, what: str) -> None:
    """The overlay's path rule plus: no ``.git`` components, no empty or ``.`` components; and inside the package
    only (a plugin's dist-info is generated from ``plugin:``, never patched or vendored)."""
    if is_plugin_dist_info(path, package):
        raise InputError(f"{what} path {path!r} leaves the {package} package (must be relative, under {package}/)")
    check_relative_path(path, package, what=what)
    parts = PurePosixPath(path).parts
    if len(parts) < 2 or any(p in (".git", ".") for p in parts) or "//" in path or path.endswith("/"):
        raise InputError(f"{what} path {path!r} is not a plain file path inside the {package} package")
