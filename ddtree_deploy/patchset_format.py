"""The patch-set format: ``patches/<name>/<package>-<version>/patchset.yaml`` plus its ``.patch`` series.

Loading validates everything a hostile or sloppy patch set could get wrong *before* any file is staged: schema
(every error names the file and field), series entries that leave the patch-set directory or are symlinks, patches
whose paths leave the package (``../``, absolute, ``.git``), symlinks or submodules created by a patch (mode
120000/160000), binary patches, deletions and renames (an overlay can only add or replace files), vendored runtime
files that are symlinks or leave the package, and files over the size limit. A loaded :class:`PatchSet` is
therefore safe to hand to the apply engine (``patch_apply``) and the developer workflow (``patch_dev``).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from . import paths
from .errors import InputError, PatchDoesNotApply
from .overlay import check_relative_path
from .schema import Field, validate

#: Largest file a patch set may ship (a patch, a vendored runtime file, the YAML): protects the tool and the hosts
#: from a patch set that smuggles in a blob. Real DDTree patches are a few KiB.
MAX_FILE_BYTES = 2 * 1024 * 1024
PATCHSET_FILE = "patchset.yaml"
#: Files of a runtime directory that are build products, never vendored.
RUNTIME_SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
RUNTIME_SKIP_SUFFIXES = (".pyc", ".pyo")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_SERIES_ENTRY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}\.(patch|diff)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
MODE_FILE, MODE_EXEC, MODE_SYMLINK, MODE_GITLINK = "100644", "100755", "120000", "160000"


def default_patches_root() -> Path:
    """Where named patch sets live: ``$DDTREE_PATCHES``, else the checkout's ``patches/``, else the packaged ones
    (never the current directory's ``patches/``: see ddtree_deploy.paths)."""
    return paths.patches_root()


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
    """The overlay's path rule plus: no ``.git`` components, no empty or ``.`` components."""
    check_relative_path(path, package, what=what)
    parts = PurePosixPath(path).parts
    if len(parts) < 2 or any(p in (".git", ".") for p in parts) or "//" in path or path.endswith("/"):
        raise InputError(f"{what} path {path!r} is not a plain file path inside the {package} package")


# -- the patch set -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Runtime:
    """Vendored files copied whole into the overlay: ``files`` maps overlay path → source file."""

    source: Path
    dest: str
    files: tuple[tuple[str, Path], ...]


@dataclass(frozen=True)
class PatchSet:
    """A validated patch set: metadata, the parsed series, and the runtime files it vendors."""

    name: str
    version: str
    description: str
    yaml_path: Path
    base_package: str
    base_version: str
    base_files: dict[str, str]
    requires: dict[str, str]
    patches: tuple[PatchFile, ...]
    runtime: Runtime | None
    vendor: tuple[Runtime, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def vendored(self) -> tuple[Runtime, ...]:
        """Every directory the overlay carries whole: the runtime first, then the ``vendor`` entries."""
        return ((self.runtime,) if self.runtime else ()) + self.vendor

    @property
    def dir(self) -> Path:
        return self.yaml_path.parent

    @property
    def series(self) -> list[str]:
        return [p.name for p in self.patches]

    @property
    def qualified_name(self) -> str:
        """``<name>/<directory>``, e.g. ``ddtree/sglang-0.5.11``: what ``load_patchset`` takes back."""
        return f"{self.name}/{self.dir.name}"

    def touched_files(self) -> dict[str, str]:
        """Every file the series changes → the first patch that changes it (in series order)."""
        out: dict[str, str] = {}
        for p in self.patches:
            for path in p.touched:
                out.setdefault(path, p.name)
        return out

    def created_files(self) -> dict[str, str]:
        """Files the series creates (not in the base) → the patch that creates them."""
        return {f.path: p.name for p in self.patches for f in p.files if f.new_file}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.qualified_name, "version": self.version, "description": self.description,
            "path": str(self.yaml_path),
            "base": {"package": self.base_package, "version": self.base_version, "files": dict(self.base_files)},
            "requires": dict(self.requires),
            "series": [{"name": p.name, "subject": p.subject, "files": p.touched,
                        "added": p.stat()[0], "removed": p.stat()[1]} for p in self.patches],
            "runtime": None if self.runtime is None else {
                "source": str(self.runtime.source), "dest": self.runtime.dest,
                "files": [dest for dest, _ in self.runtime.files]},
            "vendor": [{"source": str(v.source), "dest": v.dest, "files": [dest for dest, _ in v.files]}
                       for v in self.vendor],
        }


def _check_name(value: str) -> str | None:
    return None if _NAME.match(value) else "expected a lower-case name (letters, digits, '.', '_', '-')"


def _check_version(value: str) -> str | None:
    try:
        Version(value)
    except InvalidVersion:
        return "expected a version such as 0.5.11"
    return None


def _check_requires(value: dict[str, Any]) -> str | None:
    for key, spec in value.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            return f"requirement {key!r} has an invalid version specifier {spec!r} (expected e.g. '>=2.11,<2.12')"
    return None


def _check_series_entry(value: str) -> str | None:
    if "/" in value or "\\" in value or value.startswith("."):
        return "a series entry must be a file name inside the patch-set directory (no '/', no '..')"
    return None if _SERIES_ENTRY.match(value) else "expected a file name ending in .patch or .diff"


SCHEMA: dict[str, Field] = {
    "name": Field("str", required=True, check=_check_name, help="patch-set name, e.g. ddtree"),
    "version": Field("str", required=True, check=_check_version, help="version of the patch set itself"),
    "description": Field("str", default=""),
    "base": Field("mapping", required=True, help="the package release the series was made against", fields={
        "package": Field("str", required=True, check=_check_name),
        "version": Field("str", required=True, check=_check_version, help="quote it: '0.5.11'"),
        "files": Field("mapping", default=dict, help="sha256 of every base file the series touches"),
    }),
    "requires": Field("str-map", default=dict, check=_check_requires),
    "series": Field("list", required=True, items=Field("str", check=_check_series_entry)),
    "runtime": Field("mapping", default=dict, fields={
        "source": Field("str", help="directory of vendored files, relative to patchset.yaml"),
        "dest": Field("str", help="where they go in the package, e.g. sglang/srt/speculative/ddtree"),
    }),
    # More directories vendored whole, like the runtime (e.g. integration code shared by several bases).
    "vendor": Field("list", default=list, items=Field("mapping", fields={
        "source": Field("str", required=True, help="directory of vendored files, relative to patchset.yaml"),
        "dest": Field("str", required=True, help="where they go in the package"),
    })),
}


def check_regular_file(path: Path, *, what: str) -> None:
    """Refuse (InputError naming `what` and the path) a missing file, a symlink, anything but a regular file, and a
    file over the size limit: a patch set is untrusted input and may not reach outside itself."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"{what} {path} is a symlink: refused")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path} is not a regular file: refused")
    if st.st_size > MAX_FILE_BYTES:
        raise InputError(f"{what} {path} is {st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit per file")


def read_limited(path: Path, *, what: str) -> bytes:
    """Read a regular file that is not a symlink and not over the size limit."""
    check_regular_file(path, what=what)
    return path.read_bytes()


def load_patchset(name_or_path: str | Path, *, root: Path | None = None) -> PatchSet:
    """Load and fully validate a patch set by path (file or directory) or name (``ddtree/sglang-0.5.11``).

    A bare name (``ddtree``) needs a base version: use :func:`find_patchset_for`.
    """
    yaml_path = resolve_patchset_path(name_or_path, root=root)
    return _load_yaml(yaml_path)


def resolve_patchset_path(name_or_path: str | Path, *, root: Path | None = None) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p.resolve()
    if (p / PATCHSET_FILE).is_file():
        return (p / PATCHSET_FILE).resolve()
    root = root or default_patches_root()
    text = str(name_or_path)
    if "/" in text and not text.startswith((".", "/")):
        candidate = root / text / PATCHSET_FILE
        if candidate.is_file():
            return candidate.resolve()
        available = ", ".join(list_patchset_names(root)) or "none"
        raise InputError(f"patch set {text!r}: no {candidate} (available under {root}: {available})")
    if _NAME.match(text) and (root / text).is_dir():
        bases = [d.name for d in sorted((root / text).iterdir()) if (d / PATCHSET_FILE).is_file()]
        if len(bases) == 1:  # only one base: no ambiguity
            return (root / text / bases[0] / PATCHSET_FILE).resolve()
        raise InputError(f"patch set {text!r} has one folder per base ({', '.join(bases) or 'none'}): "
                         f"name one (e.g. {text}/{bases[0] if bases else 'sglang-X'}) or give --base/--snapshot")
    raise InputError(f"patch set {text!r} not found: not a file, not a directory with {PATCHSET_FILE}, "
                     f"not a name under {root}")


def list_patchset_names(root: Path | None = None) -> list[str]:
    """Every ``<name>/<dir>`` under the patches root that has a patchset.yaml."""
    root = root or default_patches_root()
    if not root.is_dir():
        return []
    return sorted(f"{y.parent.parent.name}/{y.parent.name}" for y in root.glob(f"*/*/{PATCHSET_FILE}"))


def find_patchset_for(name: str, base_version: str, *, package: str = "sglang", root: Path | None = None,
                      allow_drift: bool = False) -> PatchSet:
    """The patch set ``name`` made for ``package==base_version``.

    With ``allow_drift`` and no exact match, the one with the highest base version not above ``base_version``
    (else the lowest) is returned; the apply step then reports the drift loudly.
    """
    if "/" in name or Path(name).exists():
        return load_patchset(name, root=root)
    root = root or default_patches_root()
    folder = root / name
    candidates = sorted(folder.glob(f"*/{PATCHSET_FILE}")) if folder.is_dir() else []
    if not candidates:
        raise InputError(f"no patch set named {name!r} under {root} (available: {', '.join(list_patchset_names(root)) or 'none'})")
    loaded = [_load_yaml(c.resolve()) for c in candidates]
    mine = [ps for ps in loaded if ps.base_package == package]
    for ps in mine:
        if ps.base_version == base_version:
            return ps
    bases = ", ".join(ps.base_version for ps in mine) or "none"
    if allow_drift and mine:
        target = Version(base_version)
        below = [ps for ps in mine if Version(ps.base_version) <= target]
        pick = max(below, key=lambda ps: Version(ps.base_version)) if below else min(mine, key=lambda ps: Version(ps.base_version))
        return pick
    raise PatchDoesNotApply(
        f"patch set {name!r} has no series for {package} {base_version} (bases it supports: {bases})",
        hint="port it with `ddtree-deploy patchset dev` + `refresh`, or pass --allow-base-drift to try the nearest one",
    )


def _load_yaml(yaml_path: Path) -> PatchSet:
    src = str(yaml_path)
    raw_bytes = read_limited(yaml_path, what="patch-set file")
    try:
        doc = yaml.safe_load(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{src}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{src}: invalid YAML: {exc}") from None
    data = validate(doc, SCHEMA, source=src)
    base = data["base"]
    package = base["package"]
    ps_dir = yaml_path.parent

    expect_dir = f"{package}-{base['version']}"
    if re.match(rf"^{re.escape(package)}-\d", ps_dir.name) and ps_dir.name != expect_dir:
        raise InputError(f"{src}: field 'base.version': {base['version']!r} does not match the directory name "
                         f"{ps_dir.name!r} (expected {expect_dir!r})")

    files: dict[str, str] = {}
    for path, digest in (base["files"] or {}).items():
        if not isinstance(path, str):
            raise InputError(f"{src}: field 'base.files': key {path!r} is not a path string")
        check_path_in_package(path, package, what=f"{src}: field 'base.files'")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise InputError(f"{src}: field 'base.files.{path}': expected a sha256 hex digest (64 lower-case hex "
                             f"characters), got {digest!r}")
        files[path] = digest

    if len(set(data["series"])) != len(data["series"]):
        dup = next(s for s in data["series"] if data["series"].count(s) > 1)
        raise InputError(f"{src}: field 'series': {dup!r} is listed twice")
    patches = []
    for idx, entry in enumerate(data["series"]):
        ppath = ps_dir / entry
        if ppath.is_symlink():
            raise InputError(f"{src}: field 'series[{idx}]': {entry} is a symlink: refused (patches must be files in {ps_dir})")
        if ppath.resolve().parent != ps_dir.resolve():
            raise InputError(f"{src}: field 'series[{idx}]': {entry!r} is not inside the patch-set directory {ps_dir}")
        body = read_limited(ppath, what=f"{src}: field 'series[{idx}]': patch")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{ppath}: not UTF-8 text") from None
        subject, fps, is_mbox = parse_patch(text, source=str(ppath), package=package)
        patches.append(PatchFile(name=entry, path=ppath, subject=subject, files=fps, is_mbox=is_mbox))

    ps = PatchSet(name=data["name"], version=data["version"], description=data["description"], yaml_path=yaml_path,
                  base_package=package, base_version=base["version"], base_files=files,
                  requires={k: str(v) for k, v in data["requires"].items()}, patches=tuple(patches),
                  runtime=_load_runtime(data["runtime"], ps_dir, package, src),
                  vendor=tuple(_load_runtime(v, ps_dir, package, src, field=f"vendor[{i}]")
                               for i, v in enumerate(data["vendor"])), raw=doc)
    _cross_check(ps, src)
    return ps


def _load_runtime(spec: dict[str, Any], ps_dir: Path, package: str, src: str, *,
                  field: str = "runtime") -> Runtime | None:
    if not spec:
        return None
    for key in ("source", "dest"):
        if not spec.get(key):
            raise InputError(f"{src}: missing required field '{field}.{key}'")
    dest = spec["dest"].rstrip("/")
    check_path_in_package(dest, package, what=f"{src}: field '{field}.dest'")
    if Path(spec["source"]).is_absolute():
        raise InputError(f"{src}: field '{field}.source': must be relative to {PATCHSET_FILE}, got {spec['source']!r}")
    family = ps_dir.parent.resolve()  # patches/<name>/: the runtime may be shared by the bases of one patch set
    source = (ps_dir / spec["source"]).resolve()
    if source != family and family not in source.parents:
        raise InputError(f"{src}: field '{field}.source': {spec['source']!r} leaves {family} (the patch set's folder)")
    if not source.is_dir():
        raise InputError(f"{src}: field '{field}.source': {source} is not a directory")
    files: list[tuple[str, Path]] = []
    for rel, path in _walk_runtime(source, src):
        out_path = f"{dest}/{rel}"
        check_path_in_package(out_path, package, what=f"{src}: {field} file")
        files.append((out_path, path))
    if not files:
        raise InputError(f"{src}: field '{field}.source': {source} has no files to vendor")
    return Runtime(source=source, dest=dest, files=tuple(sorted(files)))


def _walk_runtime(source: Path, src: str) -> Iterator[tuple[str, Path]]:
    """Every regular file under ``source`` (skipping caches), refusing symlinks, specials and oversized files."""
    for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if d in RUNTIME_SKIP_DIRS:
                dirnames.remove(d)
            elif (base / d).is_symlink():
                raise InputError(f"{src}: runtime directory {base / d} is a symlink: refused")
        dirnames.sort()
        for name in sorted(filenames):
            path = base / name
            if name.endswith(RUNTIME_SKIP_SUFFIXES):
                continue
            check_regular_file(path, what=f"{src}: runtime file")
            yield path.relative_to(source).as_posix(), path


def _cross_check(ps: PatchSet, src: str) -> None:
    """Series and metadata agree: hashes for every base file touched, no file both patched and vendored."""
    created: set[str] = set()
    for p in ps.patches:
        for f in p.files:
            if f.new_file:
                if f.path in created:
                    raise InputError(f"{p.path}: creates {f.path}, which an earlier patch of the series created")
                created.add(f.path)
            elif f.path not in created and f.path not in ps.base_files:
                raise InputError(f"{src}: field 'base.files': no sha256 for {f.path}, which {p.name} changes "
                                 "(every base file the series touches needs one; `patchset refresh` writes them)")
    owners: dict[str, str] = {}
    for i, v in enumerate(ps.vendored):
        name = "runtime" if (ps.runtime is not None and i == 0) else f"vendor[{i - (ps.runtime is not None)}]"
        for dest, _ in v.files:
            if dest in owners:
                raise InputError(f"{src}: field '{name}.dest': {dest} is vendored twice ({owners[dest]} and {name})")
            owners[dest] = name
    clash = sorted(set(ps.touched_files()) & set(owners))
    if clash:
        raise InputError(f"{src}: field '{owners[clash[0]]}.dest': {clash[0]} is both patched by the series and "
                         "vendored; keep one owner per file")
