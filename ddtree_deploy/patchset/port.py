"""``patchset port``: rebase a series made for one SGLang release onto the next, hunk by hunk, by three-way merge.

For every patch of the ``--from`` series, in order, and every file it changes, three texts meet: the file as the
series had it before the patch on its own base (*old*), the file after the patch there (*patched*), and the file on
the new base with the earlier ported patches applied (*new*). Each hunk is judged on its own:

- ``clean``: its context and removed lines are in *new* at its line (``offset``: at another line), as `git apply`
  would take it;
- ``present``: *new* already has what the hunk makes, not what it expects (the change is upstream now);
- ``merged``: it does not apply as written, but a three-way merge of that hunk alone (``git merge-file``, old as
  the common ancestor) has no conflict;
- ``conflict``: that merge conflicts;

then the whole file is merged the same way. A file whose merge conflicts is written, with diff3 conflict markers, to
``<work>/<patch>/<path>``; the maintainer edits it there (markers removed) and runs the same port again with the same
``--work`` directory, which takes the edited file as that patch's result for that file (``resolved``), provided the
three inputs are still the ones it was made from (``port.json`` records their hashes; a changed input is refused, so
a stale resolution never lands silently).

When nothing conflicts, the new series is committed in a small git repository (the new base's touched files, then
one commit per patch with the original's author, date and message) and written with the same `git format-patch`
form ``patchset refresh`` uses, so a ported series is byte-identical to what dev + refresh would give for the same
content. A patch left empty (every hunk ``present``) drops out of the series and is reported. ``patchset.yaml`` is
the old one with ``base.version``, ``base.files``, the series, the requirements the new wheel pins (torch, python)
and its ``stack:`` (the exact torch, sglang-kernel and flashinfer-python it pins, its Python floor) rewritten, its
comments kept; what METADATA does not say is copied from the old base and named in the notes for review: the
``traits:`` (what the vendored code reads about the base) and ``stack.cuda``. Nothing is written into the patches
tree on a conflict (exit 5) or under ``dry_run``, and an existing series folder is replaced only with ``force``.

Hooks (``hooks:``, delivered through SGLang's plugin framework) are ported by reading each target's definition in
the new base: ``unchanged`` (same sha256), ``changed`` (the new hash is written into the new ``patchset.yaml`` and
the target is reported with how many of its lines differ: what to review before the new series is trusted), or
``missing`` (the target is gone or moved: a conflict, exit 5, nothing written).
"""

from __future__ import annotations

import ast
import difflib
import email.parser
import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..errors import InputError, PatchDoesNotApply
from .apply import check_base, git, git_env, init_repo
from .base import BaseSource, WheelBase
from .dev import BASE_DATE, FORMAT_PATCH, _plain_message, series_entries, update_yaml_text
from .diff import FilePatch, Hunk
from .format import PATCHSET_FILE, PatchSet, load_patchset
from .hooks import definition_text, find_definition, locate, split_target
from .plugin import check_hooks
from .lifecycle import gate

PORT_STATE = "port.json"
MARKERS = re.compile(rb"^(<<<<<<<|>>>>>>>|\|\|\|\|\|\|\|)( |$)", re.M)
Progress = Callable[[str], None]


@dataclass
class HunkReport:
    file: str
    header: str
    status: str  # clean | offset | present | merged | conflict | new-file
    detail: str = ""


@dataclass
class FileReport:
    path: str
    status: str  # clean | merged | conflict | resolved | new-file | present
    conflict_file: str = ""  # where the file with conflict markers was written (conflict only)
    conflicts: int = 0


@dataclass
class PatchReport:
    name: str
    status: str  # clean | merged | resolved | conflict | present (dropped: upstream has it)
    files: list[FileReport] = field(default_factory=list)
    hunks: list[HunkReport] = field(default_factory=list)


@dataclass
class HookPort:
    hook: str  # hooks[i] (type target)
    target: str
    file: str
    status: str  # unchanged | changed | missing
    old: str  # sha256 on the --from base
    new: str  # sha256 on the new base ("" when missing)
    detail: str = ""


@dataclass
class PortResult:
    name: str
    from_version: str
    to_version: str
    base: dict[str, str]
    dest: str
    work: str
    patches: list[PatchReport]
    series: list[str]
    base_files: dict[str, str]
    requires: dict[str, str]
    written: bool
    dry_run: bool
    notes: list[str] = field(default_factory=list)
    hooks: list[HookPort] = field(default_factory=list)

    @property
    def conflicts(self) -> list[PatchReport]:
        return [p for p in self.patches if p.status == "conflict"]

    @property
    def hook_conflicts(self) -> list[HookPort]:
        return [h for h in self.hooks if h.status == "missing"]

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "ok": not self.conflicts and not self.hook_conflicts,
                "counts": _counts([h.status for p in self.patches for h in p.hunks])}


def _counts(statuses: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return out


# -- text helpers ------------------------------------------------------------------------------------------------------
def _sha(data: bytes | None) -> str:
    return "" if data is None else hashlib.sha256(data).hexdigest()


def _hunk_segments(hunk: Hunk) -> tuple[list[bytes], list[bytes]]:
    """The hunk's old lines and new lines (with their newlines, as the file holds them)."""
    old: list[bytes] = []
    new: list[bytes] = []
    last: list[list[bytes]] = []
    for raw in hunk.lines:
        tag, body = raw[:1], (raw[1:] + "\n").encode()
        if tag == "\\":  # "\ No newline at end of file": the line before has none
            for seg in last:
                seg[-1] = seg[-1][:-1]
            continue
        last = [old, new] if tag == " " else [old] if tag == "-" else [new]
        for seg in last:
            seg.append(body)
    return old, new


def _find(lines: list[bytes], seg: list[bytes], near: int) -> int | None:
    """Where ``seg`` occurs in ``lines`` (the occurrence closest to ``near``), else None."""
    if not seg:
        return near if near <= len(lines) else None
    best = None
    for i in range(len(lines) - len(seg) + 1):
        if lines[i] == seg[0] and lines[i:i + len(seg)] == seg and (best is None or abs(i - near) < abs(best - near)):
            best = i
    return best


def _apply_hunk(text: bytes, hunk: Hunk) -> bytes | None:
    """``text`` with this one hunk applied at its own line (the series applies exactly to its own base)."""
    lines = text.splitlines(keepends=True)
    old, new = _hunk_segments(hunk)
    start = max(hunk.old_start - 1, 0) if old else hunk.old_start
    if lines[start:start + len(old)] != old:
        return None
    return b"".join(lines[:start] + new + lines[start + len(old):])


def _merge(work: Path, ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str],
           *, favour_theirs: bool = False) -> tuple[bytes, int]:
    """``git merge-file`` (diff3 markers): the merged text and its number of conflicts."""
    work.mkdir(parents=True, exist_ok=True)
    files = []
    for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
        (work / name).write_bytes(data)
        files.append(str(work / name))
    args = ["merge-file", "-p", "--diff3", "-L", labels[0], "-L", labels[1], "-L", labels[2]]
    if favour_theirs:
        args.append("--theirs")
    proc = git(work, *args, *files, check=False)
    if proc.returncode < 0:
        raise InputError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout, proc.returncode


# -- requirements the new base pins --------------------------------------------------------------------------------------
def base_metadata(base: BaseSource) -> str | None:
    """The METADATA of the base's dist-info when the base carries it (a wheel does; a snapshot may)."""
    name = f"{base.package.replace('-', '_')}-{base.version}.dist-info/METADATA"
    if isinstance(base, WheelBase):
        try:
            return base._zip.read(name).decode("utf-8", "replace")
        except KeyError:
            return None
    try:
        return base.read(name).decode("utf-8", "replace")
    except (FileNotFoundError, KeyError, OSError):
        return None


def pinned_requirements(metadata: str) -> dict[str, str]:
    """``torch`` (the release line the base pins, ``>=X.Y,<X.Y+1``) and ``python`` (Requires-Python)."""
    msg = email.parser.HeaderParser().parsestr(metadata)
    out: dict[str, str] = {}
    if msg.get("Requires-Python"):
        out["python"] = str(msg["Requires-Python"]).strip()
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(str(line))
        except InvalidRequirement:
            continue
        if req.name.lower() != "torch" or req.marker is not None:
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if pins:
            v = Version(pins[0])
            out["torch"] = f">={v.major}.{v.minor},<{v.major}.{v.minor + 1}"
        elif str(req.specifier):
            out["torch"] = str(req.specifier)
    return out


#: ``stack:`` field -> the distribution whose exact pin it records.
STACK_PINS = {"torch": "torch", "kernel": "sglang-kernel", "flashinfer": "flashinfer-python"}


def pinned_stack(metadata: str) -> dict[str, str] | None:
    """What ``stack:`` records from a wheel's METADATA: the exact release of each of ``STACK_PINS`` (a pin under a
    marker or an extra pins nothing) and Requires-Python's floor; None when one of them is not there."""
    msg = email.parser.HeaderParser().parsestr(metadata)
    out: dict[str, str] = {}
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(str(line))
        except InvalidRequirement:
            continue
        field_ = next((k for k, d in STACK_PINS.items() if canonicalize_name(req.name) == d), None)
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if field_ and req.marker is None and len(pins) == 1:
            out[field_] = pins[0]
    floor = re.match(r"^>=\s*(3\.\d+)$", str(msg.get("Requires-Python") or "").strip())
    if floor:
        out["python"] = floor.group(1)
    return out if set(out) == {*STACK_PINS, "python"} else None


# -- the port ------------------------------------------------------------------------------------------------------------
class _Work:
    """The ``--work`` directory: conflict files to edit, and the record of what each was made from."""

    def __init__(self, path: Path, from_v: str, to_v: str, *, write: bool) -> None:
        self.path = path
        self.write = write
        self.state_path = path / PORT_STATE
        self.state: dict[str, Any] = {"from": from_v, "to": to_v, "files": {}}
        if self.state_path.is_file():
            old = json.loads(self.state_path.read_text())
            if (old.get("from"), old.get("to")) != (from_v, to_v):
                raise InputError(f"{path}: a port work directory for {old.get('from')} -> {old.get('to')}, not "
                                 f"{from_v} -> {to_v}; give another --work directory")
            self.state = old

    def resolution(self, key: str, inputs: dict[str, str]) -> tuple[bytes | None, str]:
        """(the edited file, "") when the maintainer resolved it; (None, why not) otherwise."""
        target = self.path / key
        if not target.is_file():
            return None, ""
        recorded = self.state["files"].get(key)
        if recorded != inputs:
            raise InputError(f"{target}: resolved against other inputs than this port has (the base, the series or an "
                             "earlier resolution changed); delete it (and its port.json entry) to start it again")
        data = target.read_bytes()
        if MARKERS.search(data):
            return None, f"{target} still has conflict markers"
        return data, ""

    def conflict(self, key: str, inputs: dict[str, str], marked: bytes) -> str:
        target = self.path / key
        if self.write and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(marked)
            self.state["files"][key] = inputs
            self.state_path.write_text(json.dumps(self.state, indent=1, sort_keys=True) + "\n")
        return str(target)


def port_patchset(patchset: PatchSet, old_base: BaseSource, new_base: BaseSource, *, to_version: str,
                  work: Path | None = None, dest_root: Path | None = None, force: bool = False,
                  dry_run: bool = False, progress: Progress | None = None) -> PortResult:
    """Port ``patchset`` (made on ``old_base``) onto ``new_base``; write ``<root>/<name>/<pkg>-<to>/`` when clean.

    Raises PatchDoesNotApply (exit 5) after reporting when a hunk conflicts (the result is on the exception's
    ``port`` attribute); InputError (exit 2) for a wrong base, an existing destination without ``force``, or a stale
    resolution.
    """
    say = progress or (lambda _m: None)
    pkg = patchset.base_package
    if new_base.package != pkg:
        raise InputError(f"the new base is {new_base.package}, the patch set patches {pkg}")
    if new_base.version != to_version:
        raise InputError(f"--to {to_version}: the new base ({new_base.label}) is {pkg} {new_base.version}")
    if Version(to_version) <= Version(patchset.base_version):
        raise InputError(f"--to {to_version} is not newer than the series' base {patchset.base_version}")
    check_base(patchset, old_base, allow_base_drift=False)  # the series' own base, hashes exact
    stale = check_hooks(patchset, old_base)
    if stale:
        raise InputError(f"{patchset.qualified_name}: its hooks do not match its own base {old_base.label}: "
                         + "; ".join(f"{m['hook']}: {m['reason']}" for m in stale))
    dest_root = Path(dest_root) if dest_root is not None else patchset.dir.parent
    dest = dest_root / f"{pkg}-{to_version}"
    if dest.exists() and not force and not dry_run:
        raise InputError(f"{dest}: exists; pass --force to replace its series and patchset.yaml")
    keep_work = work is not None
    work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix=f"ddtree-port-{to_version}-"))
    box = _Work(work, patchset.base_version, to_version, write=not dry_run)

    old_cur: dict[str, bytes | None] = {}
    new_cur: dict[str, bytes | None] = {}
    for path in patchset.touched_files():
        old_cur[path] = old_base.read(path) if old_base.has(path) else None
        new_cur[path] = new_base.read(path) if new_base.has(path) else None
    new_base_files = {p: d for p, d in new_cur.items() if d is not None}
    reports: list[PatchReport] = []
    results: list[dict[str, bytes]] = []  # per patch: path -> the new base's file after it
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ddtree-port-merge-") as tmp:
        scratch = Path(tmp)
        for patch in patchset.patches:
            say(f"porting {patch.name}")
            verdict, why = gate(patch, pkg, to_version)
            if verdict != "apply":  # its change still shapes what the old side holds for the later patches
                for fp in patch.files:
                    old_cur[fp.path] = _patched(patch.name, fp, old_cur[fp.path] or b"", patchset.base_version)
                status = "skipped" if verdict == "skip" else "conflict"
                reports.append(PatchReport(name=patch.name, status=status,
                                           hunks=[HunkReport("", "(series entry)", status, why)]))
                results.append({})
                continue
            rep = PatchReport(name=patch.name, status="clean")
            after: dict[str, bytes] = {}
            for fp in patch.files:
                frep = _port_file(patch.name, fp, old_cur, new_cur, rep, box, scratch, to_version, patchset.base_version)
                rep.files.append(frep)
                after[fp.path] = new_cur[fp.path] or b""
            kinds = {f.status for f in rep.files}
            rep.status = ("conflict" if "conflict" in kinds else "resolved" if "resolved" in kinds
                          else "merged" if "merged" in kinds else "present" if kinds == {"present"} else "clean")
            reports.append(rep)
            results.append(after)

    ported = [(p, r) for p, r in zip(patchset.patches, reports, strict=True) if r.status not in ("present", "skipped")]
    for p, r in zip(patchset.patches, reports, strict=True):
        if r.status == "present":
            notes.append(f"{p.name}: every hunk is already in {pkg} {to_version}; left out of the new series")
        elif r.status == "skipped":
            notes.append(f"{p.name}: {r.hunks[0].detail}; left out of the new series")
    metadata = base_metadata(new_base)
    requires = dict(patchset.requires)
    if metadata:
        requires.update(pinned_requirements(metadata))
    else:
        notes.append(f"{new_base.label} carries no METADATA: requires kept from {patchset.base_version}")
    stack = pinned_stack(metadata) if metadata and patchset.stack else None
    notes += _copied_forward(patchset, stack, to_version)
    result = PortResult(name=patchset.name, from_version=patchset.base_version, to_version=to_version,
                        base=new_base.describe(), dest=str(dest), work=str(work), patches=reports,
                        series=[p.name for p, _ in ported], base_files={}, requires=requires, written=False,
                        dry_run=dry_run, notes=notes, hooks=port_hooks(patchset, old_base, new_base))
    if result.conflicts or result.hook_conflicts:
        if not keep_work and dry_run:
            shutil.rmtree(work, ignore_errors=True)
        names = ", ".join([r.name for r in result.conflicts] + [h.hook for h in result.hook_conflicts])
        exc = PatchDoesNotApply(
            f"{patchset.qualified_name} does not port to {pkg} {to_version}: {names} conflict"
            + ("" if dry_run else f"; the files to edit (diff3 markers) are under {work}")
            + f"; nothing was written into {dest_root}",
            hint=f"edit them there (remove the markers), then run the same port again with --work {work}")
        exc.port = result  # type: ignore[attr-defined]
        raise exc

    with tempfile.TemporaryDirectory(prefix="ddtree-port-series-") as tmp:
        bodies, base_files = _format_series(Path(tmp), patchset, new_base_files, [(p, results[patchset.patches.index(p)])
                                                                                 for p, _ in ported])
    result.base_files = base_files
    new_yaml = _new_yaml(patchset, to_version, series_entries(patchset, result.series), base_files, requires, stack)
    new_yaml = update_hook_hashes(new_yaml, {i: h.new for i, h in enumerate(result.hooks) if h.status == "changed"})
    _validate(dest_root, dest.name, new_yaml, bodies)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
        result.work = ""
    if dry_run:
        return result
    _write_series(patchset, dest, new_yaml, bodies, notes)
    result.written = True
    return result


def _port_file(patch: str, fp: FilePatch, old_cur: dict[str, bytes | None], new_cur: dict[str, bytes | None],
               rep: PatchReport, box: _Work, scratch: Path, to_v: str, from_v: str) -> FileReport:
    path = fp.path
    old_before = old_cur[path]
    new_before = new_cur[path]
    if fp.new_file:
        created = _apply_hunk(b"", fp.hunks[0]) if fp.hunks else b""
        if new_before is not None:
            rep.hunks.append(HunkReport(path, "(new file)", "conflict", f"{to_v} already has {path}"))
            return FileReport(path, "conflict", conflicts=1)
        rep.hunks.append(HunkReport(path, "(new file)", "new-file"))
        old_cur[path] = new_cur[path] = created
        return FileReport(path, "new-file")
    assert old_before is not None  # the series applies to its own base (check_base + load)
    old_after = old_cur[path] = _patched(patch, fp, old_before, from_v)
    if new_before is None:
        rep.hunks += [HunkReport(path, h.header, "conflict", f"{to_v} has no {path}") for h in fp.hunks]
        return FileReport(path, "conflict", conflicts=len(fp.hunks))
    new_lines = new_before.splitlines(keepends=True)
    statuses = []
    for h in fp.hunks:
        old_seg, new_seg = _hunk_segments(h)
        at = _find(new_lines, old_seg, h.old_start - 1)
        if at is not None:
            st = "clean" if at == h.old_start - 1 else "offset"
            detail = "" if st == "clean" else f"at line {at + 1} (offset {at - h.old_start + 1:+d})"
        elif _find(new_lines, new_seg, h.new_start - 1) is not None:
            st, detail = "present", f"{to_v} already has this change"
        else:
            single = _apply_hunk(old_before, h) or old_before
            _, n = _merge(scratch, new_before, old_before, single, (to_v, from_v, patch))
            st, detail = ("merged", "three-way merge, no conflict") if n == 0 else ("conflict", f"{n} conflict(s)")
        statuses.append(st)
        rep.hunks.append(HunkReport(path, h.header, st, detail))
    if statuses and all(s == "present" for s in statuses):
        return FileReport(path, "present")
    merged, n = _merge(scratch, new_before, old_before, old_after, (f"{to_v}", f"{from_v}", patch))
    key = f"{patch}/{path}"
    inputs = {"new": _sha(new_before), "old": _sha(old_before), "patched": _sha(old_after)}
    if n == 0:
        new_cur[path] = merged
        return FileReport(path, "merged" if any(s in ("merged", "present") for s in statuses) else "clean")
    resolved, why = box.resolution(key, inputs)
    if resolved is not None:
        new_cur[path] = resolved
        for hr in rep.hunks:
            if hr.file == path and hr.status == "conflict":
                hr.status, hr.detail = "resolved", f"taken from {box.path / key}"
        return FileReport(path, "resolved")
    where = box.conflict(key, inputs, merged)
    if why:
        for hr in rep.hunks:
            if hr.file == path and hr.status == "conflict":
                hr.detail += f"; {why}"
    if not any(hr.file == path and hr.status == "conflict" for hr in rep.hunks):  # hunks merge alone, not together
        rep.hunks.append(HunkReport(path, "(whole file)", "conflict", f"the hunks merge alone but not together: {n}"))
    # later patches of this file are judged against the patch's side of each conflict (provisional)
    new_cur[path] = _merge(scratch, new_before, old_before, old_after, (to_v, from_v, patch), favour_theirs=True)[0]
    return FileReport(path, "conflict", conflict_file=where, conflicts=n)


def _patched(patch: str, fp: FilePatch, text: bytes, from_v: str) -> bytes:
    """``text`` with every hunk of ``fp`` applied at its own line (the series applies exactly to its own base)."""
    for h in reversed(fp.hunks):  # last first: each hunk's numbers are the unpatched file's
        nxt = _apply_hunk(text, h)
        if nxt is None:
            raise InputError(f"{patch}: hunk {h.header.strip()} of {fp.path} does not apply to its own base {from_v}")
        text = nxt
    return text


def _format_series(repo: Path, patchset: PatchSet, new_base_files: dict[str, bytes],
                   ported: list[tuple[Any, dict[str, bytes]]]) -> tuple[dict[str, bytes], dict[str, str]]:
    """Commit the new base's touched files, then each ported patch (author, date, message of the original), and
    write each as `git format-patch` text (the form refresh writes). Returns (name -> bytes, base.files)."""
    new = repo / "new"
    new.mkdir()
    init_repo(new)
    env = git_env(GIT_AUTHOR_DATE=BASE_DATE, GIT_COMMITTER_DATE=BASE_DATE)
    for path, data in new_base_files.items():
        (new / path).parent.mkdir(parents=True, exist_ok=True)
        (new / path).write_bytes(data)
    git(new, "add", "-A")
    git(new, "commit", "-q", "--no-verify", "--allow-empty", "-m", "base", env=env)
    base_commit = git(new, "rev-parse", "HEAD").stdout.decode().strip()
    bodies: dict[str, bytes] = {}
    touched: set[str] = set()
    for patch, files in ported:
        for path, data in files.items():
            (new / path).parent.mkdir(parents=True, exist_ok=True)
            (new / path).write_bytes(data)
            mode = next((f.new_mode for f in patch.files if f.path == path and f.new_mode), None)
            if mode == "100755":
                (new / path).chmod(0o755)
            if path in new_base_files:
                touched.add(path)
        git(new, "add", "-A")
        meta = _metadata(patch)
        git(new, "commit", "-q", "--no-verify", "--allow-empty", "-F", "-", input=meta["message"].encode(),
            env=git_env(GIT_AUTHOR_NAME=meta["name"], GIT_AUTHOR_EMAIL=meta["email"], GIT_AUTHOR_DATE=meta["date"],
                        GIT_COMMITTER_DATE=BASE_DATE))
        sha = git(new, "rev-parse", "HEAD").stdout.decode().strip()
        bodies[patch.name] = git(new, *FORMAT_PATCH, "-1", sha).stdout
    base_files = {p: hashlib.sha256(git(new, "cat-file", "blob", f"{base_commit}:{p}").stdout).hexdigest()
                  for p in sorted(touched)}
    return bodies, base_files


def _metadata(patch: Any) -> dict[str, str]:
    """Author, date and message of a series entry as dev commits it: `git mailinfo` (what `git am` reads) for the
    mail form, the prose header and dev's fixed author and date for a plain patch."""
    if not patch.is_mbox:
        return {"name": "ddtree-deploy", "email": "ddtree-deploy@localhost", "date": BASE_DATE,
                "message": _plain_message(patch)}
    with tempfile.TemporaryDirectory(prefix="ddtree-port-meta-") as tmp:
        msg, body = Path(tmp) / "msg", Path(tmp) / "patch"
        info = git(Path(tmp), "mailinfo", "-b", "--quoted-cr=nowarn", str(msg), str(body),
                   input=patch.path.read_bytes()).stdout.decode()
        fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
        text = msg.read_text().strip("\n")
        subject = fields.get("Subject", patch.subject)
        return {"name": fields.get("Author", "ddtree"), "email": fields.get("Email", "ddtree@localhost"),
                "date": fields.get("Date") or BASE_DATE,
                "message": f"{subject}\n\n{text}\n" if text else f"{subject}\n"}


def port_hooks(patchset: PatchSet, old_base: BaseSource, new_base: BaseSource) -> list[HookPort]:
    """Each hook's target read on the new base: unchanged, changed (with how many definition lines differ), or
    missing."""
    out = []
    for h in patchset.hooks:
        loc = locate(h, new_base.has, new_base.read)
        if loc.problem is not None:
            out.append(HookPort(h.label, h.target, loc.file or "", "missing", h.sha256, "", loc.problem))
        elif loc.found == h.sha256:
            out.append(HookPort(h.label, h.target, loc.file or "", "unchanged", h.sha256, loc.found))
        else:
            old_text = _definition(h, old_base)
            new_text = _definition(h, new_base)
            diff = [ln for ln in difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), lineterm="", n=0)
                    if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
            added = sum(1 for ln in diff if ln.startswith("+"))
            out.append(HookPort(h.label, h.target, loc.file or "", "changed", h.sha256, loc.found or "",
                                f"+{added} -{len(diff) - added} line(s) in its definition: review the hook against it"))
    return out


def _definition(hook: Any, base: BaseSource) -> str:
    """The text the hook's hash is over, on ``base`` (empty where it is not found)."""
    loc = locate(hook, base.has, base.read)
    if loc.file is None or not base.has(loc.file):
        return ""
    text = base.read(loc.file).decode("utf-8")
    qual = hook.source.split("::", 1)[1] if hook.source else ".".join(split_target(hook.target, base.has)[1])
    node = find_definition(ast.parse(text), qual.split("."))
    return "" if node is None else definition_text(text, node)


def update_hook_hashes(text: str, hashes: dict[int, str]) -> str:
    """``patchset.yaml`` text with the ``sha256:`` of hook ``i`` (the i-th item of ``hooks:``) set to ``hashes[i]``,
    everything else (comments, order) kept."""
    if not hashes:
        return text
    out, section, item = [], "", -1
    for line in text.splitlines(keepends=True):
        top = re.match(r"^([A-Za-z_]+):", line)
        if top:
            section = top.group(1)
        elif section == "hooks" and re.match(r"^\s*-\s", line):
            item += 1
        if section == "hooks" and item in hashes:
            line = re.sub(r"^(\s+(?:-\s+)?sha256:\s*)[0-9a-f]{64}", rf"\g<1>{hashes[item]}", line)
        out.append(line)
    return "".join(out)


def _copied_forward(patchset: PatchSet, stack: dict[str, str] | None, to_v: str) -> list[str]:
    """The notes for what the new ``patchset.yaml`` takes from the old one unread: to review before it is trusted."""
    from_v, notes = patchset.base_version, []
    if patchset.traits:
        notes.append(f"traits: copied from {from_v} ({', '.join(f'{k}: {json.dumps(v)}' for k, v in patchset.traits.items())}); "
                     f"review them for {to_v}: what the vendored code reads about the base")
    if patchset.stack and stack is None:
        notes.append(f"stack: left out: {to_v}'s METADATA does not pin each of torch, sglang-kernel, flashinfer-python "
                     "and a Python floor (the ABI check judges it by a host's own METADATA alone)")
    elif patchset.stack:
        notes.append(f"stack.cuda: copied from {from_v} ({json.dumps(patchset.stack.get('cuda'))}): METADATA does not "
                     f"say which CUDA major {to_v}'s companions are built on; review it")
    return notes


def _stack_line(line: str, key: str, value: str) -> str:
    """A ``stack:`` field's line with a new value, its comment kept in its column."""
    body = line.rstrip("\n")
    hash_at = re.search(r"\s#", body)
    indent = body[:len(body) - len(body.lstrip())]
    new = f'{indent}{key}: "{value}"'
    if hash_at is None:
        return new + "\n"
    comment = body[hash_at.start():].lstrip()
    return new.ljust(hash_at.start() + 1) + (" " if len(new) > hash_at.start() else "") + comment + "\n"


def _new_yaml(patchset: PatchSet, to_v: str, series: list[Any], base_files: dict[str, str],
              requires: dict[str, str], stack: dict[str, str] | None = None) -> str:
    text = patchset.yaml_path.read_text()
    from_v = patchset.base_version
    text, _ = update_yaml_text(text, series=series, base_files=base_files)
    lines = text.splitlines(keepends=True)
    out = []
    section = ""
    for line in lines:
        top = re.match(r"^([A-Za-z_]+):", line)
        if top:
            section = top.group(1)
        if section == "base" and re.match(r"^\s+version:", line):
            line = re.sub(r"(version:\s*)(['\"]?)" + re.escape(from_v) + r"\2", rf"\g<1>\g<2>{to_v}\g<2>", line)
        elif top and section == "description":
            line = line.replace(f"SGLang {from_v}", f"SGLang {to_v}").replace(f"sglang {from_v}", f"sglang {to_v}")
        elif section == "requires":
            m = re.match(r"^(\s+)([A-Za-z0-9_.-]+):\s*(.*?)(\s+#.*)?$", line.rstrip("\n"))
            if m and m.group(2) in requires:
                line = f'{m.group(1)}{m.group(2)}: "{requires[m.group(2)]}"{m.group(4) or ""}\n'
        elif section == "stack":
            if stack is None:  # the new wheel does not say: no stack rather than the old base's
                continue
            m = re.match(r"^\s+([a-z]+):", line)
            if m and m.group(1) in stack:
                line = _stack_line(line, m.group(1), stack[m.group(1)])
        out.append(line)
    text = "".join(out)
    present = set(re.findall(r"^\s+([A-Za-z0-9_.-]+):", text.split("\nrequires:", 1)[1].split("\nseries:", 1)[0],
                             re.M)) if "\nrequires:" in text else set()
    missing = [k for k in requires if k not in present]
    if missing and "\nrequires:\n" in text:
        head, tail = text.split("\nrequires:\n", 1)
        text = head + "\nrequires:\n" + "".join(f'  {k}: "{requires[k]}"\n' for k in missing) + tail
    return text


def _validate(dest_root: Path, dir_name: str, new_yaml: str, bodies: dict[str, bytes]) -> None:
    """Load the result in a scratch folder next to where it goes (so vendored ``../runtime`` paths resolve the same):
    a port that would not load writes nothing."""
    dest_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dir_name}.port-", dir=dest_root))
    try:
        (scratch / PATCHSET_FILE).write_text(new_yaml)
        for name, body in bodies.items():
            (scratch / name).write_bytes(body)
        load_patchset(scratch / PATCHSET_FILE)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_series(patchset: PatchSet, dest: Path, new_yaml: str, bodies: dict[str, bytes], notes: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, body in bodies.items():
        tmp = dest / f".{name}.tmp"
        tmp.write_bytes(body)
        tmp.replace(dest / name)
    for old in dest.glob("*.patch"):
        if old.name not in bodies:
            old.unlink()
    tmp = dest / f".{PATCHSET_FILE}.tmp"
    tmp.write_text(new_yaml)
    tmp.replace(dest / PATCHSET_FILE)
    readme = patchset.dir / "README.md"
    if readme.is_file() and not (dest / "README.md").exists():
        shutil.copyfile(readme, dest / "README.md")
        notes.append(f"{dest / 'README.md'}: copied from {patchset.dir.name}; say there what differs on this base")
