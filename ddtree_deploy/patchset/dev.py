"""The developer workflow, like quilt or patch-package: edit a patch series as git commits, write it back.

``make_dev_tree`` lays the whole base package out in a new directory, commits it (tagged ``ddtree-base``), then
commits every patch of the series on top (``git am`` for mail-style patches, so author, date and message survive).
The developer edits, commits, rebases as with any branch. ``refresh_patchset`` then writes one ``.patch`` per
commit after the base (``git format-patch`` form, full blob ids, no signature: stable bytes), the sha256 of every
base file the series touches, and the new series into ``patchset.yaml`` — keeping comments and layout of the YAML.

Round trip: a series written by refresh comes back byte-identical through dev → refresh; a hand-written series
comes back in format-patch form, semantically identical (same overlay). The tests assert both.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import InputError
from .apply import SeriesDoesNotApply, check_base, git, git_env, import_pristine_blobs, init_repo
from .base import BaseSource, as_base_source
from .diff import PatchFile, parse_patch
from .format import PATCHSET_FILE, PatchSet, load_patchset

STATE_FILE = "ddtree-dev.json"  # inside .git/
BASE_TAG = "ddtree-base"
BASE_DATE = "2000-01-01T00:00:00+0000"  # fixed so the base commit (and its id) is the same for the same base
FORMAT_PATCH = ("format-patch", "--stdout", "--zero-commit", "--full-index", "--stat=80,60", "--no-signature",
                "--subject-prefix=PATCH", "--no-numbered", "--diff-algorithm=myers", "--no-renames", "--no-color")


@dataclass
class DevTree:
    path: Path
    base_commit: str
    applied: list[str]
    warnings: list[str] = field(default_factory=list)


@dataclass
class RefreshResult:
    series: list[str]
    written: list[str]
    unchanged: list[str]
    removed: list[str]
    base_files: dict[str, str]
    yaml_rewritten: bool  # False: series and hashes were already as written
    yaml_comments_kept: bool = True
    dry_run: bool = False  # nothing was written; ``diffs`` holds what would change
    diffs: dict[str, str] = field(default_factory=dict)  # file name -> unified diff (new and removed files included)


def _state_path(repo: Path) -> Path:
    return repo / ".git" / STATE_FILE


def make_dev_tree(patchset: PatchSet, base: BaseSource, dest: Path, *, allow_base_drift: bool = False,
                  progress: Callable[[str], None] | None = None) -> DevTree:
    """A git work tree at ``dest``: the base package as the first commit, then one commit per patch."""
    say = progress or (lambda _m: None)
    base = as_base_source(base)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest}: exists and is not an empty directory; give a new directory for the work tree")
    warnings = check_base(patchset, base, allow_base_drift=allow_base_drift)
    dest.mkdir(parents=True, exist_ok=True)
    say(f"writing {base.package} {base.version} from {base.label}")
    base.materialize(dest, progress=lambda n, total: say(f"wrote {n}/{total} base files"))
    init_repo(dest)
    (dest / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text("__pycache__/\n*.pyc\n")
    say("committing the base")
    git(dest, "add", "-A")
    env = git_env(GIT_AUTHOR_DATE=BASE_DATE, GIT_COMMITTER_DATE=BASE_DATE)
    git(dest, "commit", "-q", "--no-verify", "-m", f"{base.package} {base.version} (base: {base.label})", env=env)
    git(dest, "tag", BASE_TAG)
    base_commit = git(dest, "rev-parse", "HEAD").stdout.decode().strip()
    state: dict[str, Any] = {"patchset": str(patchset.yaml_path), "name": patchset.qualified_name,
                             "base": base.describe(), "base_commit": base_commit, "patches": []}
    _write_state(dest, state)
    if allow_base_drift and base.version != patchset.base_version:
        with tempfile.TemporaryDirectory(prefix="ddtree-pristine-") as tmp:
            note = import_pristine_blobs(dest, patchset, Path(tmp) / "p")
            if note:
                warnings.append(note)
    applied: list[str] = []
    for patch in patchset.patches:
        say(f"committing {patch.name}")
        ok, out = _commit_patch(dest, patch, three_way=allow_base_drift)
        if not ok:
            state["pending"] = [p.name for p in patchset.patches[len(applied):]]
            _write_state(dest, state)
            how = ("resolve the conflicts, `git add` them, `git am --continue`" if patch.is_mbox else
                   f"apply it by hand (git apply --3way {patch.path}), commit it")
            rest = [p.name for p in patchset.patches[len(applied) + 1:]]
            raise SeriesDoesNotApply(
                f"{patch.name} does not apply in the work tree {dest}; the tree stops before it "
                f"(applied: {', '.join(applied) or 'none'}).\n  git said: {out.strip()[-1500:]}",
                details={"patch": patch.name, "work_tree": str(dest), "applied": applied, "remaining": rest},
                hint=f"in {dest}: {how}, then commit the remaining patches ({', '.join(rest) or 'none'}) and run "
                     f"`ddtree-deploy patchset refresh {patchset.qualified_name} {dest}`",
            )
        sha = git(dest, "rev-parse", "HEAD").stdout.decode().strip()
        state["patches"].append({"name": patch.name, "commit": sha, "subject": _commit_subject(dest, sha)})
        applied.append(patch.name)
        _write_state(dest, state)
    return DevTree(path=dest, base_commit=base_commit, applied=applied, warnings=warnings)


def _commit_patch(repo: Path, patch: PatchFile, *, three_way: bool) -> tuple[bool, str]:
    if patch.is_mbox:
        args = ["am", "-q", "--keep-cr", "--keep-non-patch", "--committer-date-is-author-date"]
        if three_way:
            args.append("--3way")
        proc = git(repo, *args, str(patch.path), check=False)
        if proc.returncode == 0 and not _has_mail_date(patch):  # no Date: header → a fixed date, not "now"
            env = git_env(GIT_COMMITTER_DATE=BASE_DATE)
            git(repo, "commit", "-q", "--amend", "--no-edit", "--no-verify", f"--date={BASE_DATE}", env=env)
        return proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")
    args = ["apply", "--index", "-p1", "--whitespace=nowarn"] + (["--3way"] if three_way else [])
    proc = git(repo, *args, str(patch.path), check=False)
    if proc.returncode != 0 or b"with conflicts" in proc.stderr:
        return False, (proc.stdout + proc.stderr).decode(errors="replace")
    message = _plain_message(patch)
    env = git_env(GIT_AUTHOR_DATE=BASE_DATE, GIT_COMMITTER_DATE=BASE_DATE)
    git(repo, "commit", "-q", "--no-verify", "-F", "-", input=message.encode(), env=env)
    return True, ""


def _has_mail_date(patch: PatchFile) -> bool:
    head = patch.path.read_text().split("\n\n", 1)[0]
    return any(line.startswith("Date:") for line in head.splitlines())


def _plain_message(patch: PatchFile) -> str:
    """The prose before the first diff of a plain patch becomes the commit message (DEP-3 headers included)."""
    text = patch.path.read_text()
    head = re.split(r"^(?:diff --git |--- )", text, maxsplit=1, flags=re.M)[0].strip("\n")
    if not head.strip():
        return patch.path.stem + "\n"
    first, _, rest = head.partition("\n")
    if first.startswith(("Description:", "Subject:")):
        first = first.split(":", 1)[1].strip()
    return f"{first}\n\n{rest.strip()}\n" if rest.strip() else f"{first}\n"


def _commit_subject(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha).stdout.decode().strip()


def _write_state(repo: Path, state: dict[str, Any]) -> None:
    _state_path(repo).write_text(json.dumps(state, indent=1) + "\n")


def read_state(repo: Path) -> dict[str, Any]:
    path = _state_path(Path(repo))
    if not path.is_file():
        raise InputError(f"{repo}: not a work tree made by `ddtree-deploy patchset dev` (no .git/{STATE_FILE})")
    return json.loads(path.read_text())


def slug(subject: str) -> str:
    s = re.sub(r"^\[[^\]]*\]\s*", "", subject).lower()
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s[:52].rstrip("-") or "patch"


def refresh_patchset(patchset: PatchSet, repo: Path, *, renumber: bool = False, dry_run: bool = False) -> RefreshResult:
    """Write the commits after the base of ``repo`` back as ``patchset``'s series; nothing is written on error.
    ``dry_run``: every check runs, nothing is written, and the result says what would be (with the diffs)."""
    repo = Path(repo)
    state = read_state(repo)
    base_version = state["base"]["version"]
    if base_version != patchset.base_version or state["base"]["package"] != patchset.base_package:
        raise InputError(
            f"{patchset.yaml_path}: field 'base.version' is {patchset.base_version}, but the work tree {repo} was made "
            f"from {state['base']['package']} {base_version}",
            hint=f"to port, copy the patch-set folder to {patchset.base_package}-{base_version}, set base.version there "
                 "and refresh into it")
    if (repo / ".git" / "rebase-apply").exists() or (repo / ".git" / "rebase-merge").exists():
        raise InputError(f"{repo}: a `git am` or rebase is in progress; finish it (--continue) or abort it first")
    dirty = git(repo, "status", "--porcelain", "--untracked-files=all").stdout.decode().strip()
    if dirty:
        first = "\n    ".join(dirty.splitlines()[:10])
        raise InputError(f"{repo}: uncommitted changes; commit them (one commit per patch) first:\n    {first}")
    base_commit = state["base_commit"]
    if git(repo, "merge-base", "--is-ancestor", base_commit, "HEAD", check=False).returncode != 0:
        raise InputError(f"{repo}: HEAD does not descend from the base commit {base_commit[:12]} (tag {BASE_TAG})")
    if git(repo, "rev-list", "--merges", f"{base_commit}..HEAD").stdout.strip():
        raise InputError(f"{repo}: the history after the base has merge commits; make it linear (git rebase)")
    commits = git(repo, "rev-list", "--reverse", f"{base_commit}..HEAD").stdout.decode().split()
    if not commits:
        raise InputError(f"{repo}: no commits after the base; the series would be empty")

    known = {p["commit"]: p["name"] for p in state.get("patches", [])}
    by_subject: dict[str, str] = {}
    for p in state.get("patches", []):
        by_subject.setdefault(p["subject"], p["name"])
    names: list[str] = []
    bodies: dict[str, bytes] = {}
    touched: set[str] = set()
    for pos, sha in enumerate(commits, 1):
        subject = _commit_subject(repo, sha)
        name = None if renumber else (known.get(sha) or by_subject.get(subject))
        if name is None or name in names:
            name = f"{pos:04d}-{slug(subject)}.patch"
            while name in names:
                name = name[:-6] + "-x.patch"
        body = git(repo, *FORMAT_PATCH, "-1", sha).stdout
        parse_patch(body.decode("utf-8"), source=f"{repo} commit {sha[:12]} ({subject})", package=patchset.base_package)
        names.append(name)
        bodies[name] = body
        status = git(repo, "diff-tree", "--no-commit-id", "--name-status", "-r", "--no-renames", sha).stdout.decode()
        for line in status.splitlines():
            kind, path = line.split("\t", 1)
            if kind != "A":
                touched.add(path)
    for vendored in patchset.vendored:
        clash = sorted(touched & {d for d, _ in vendored.files})
        if clash:
            raise InputError(f"{repo}: commits change {clash[0]}, which the patch set vendors from "
                             f"{vendored.source}; edit it there instead")
    base_files: dict[str, str] = {}
    for path in sorted(touched):
        blob = git(repo, "cat-file", "blob", f"{base_commit}:{path}", check=False)
        if blob.returncode == 0:  # else: created by an earlier commit of the series
            base_files[path] = hashlib.sha256(blob.stdout).hexdigest()

    old_text = patchset.yaml_path.read_text()
    new_text, kept = update_yaml_text(old_text, series=series_entries(patchset, names), base_files=base_files)
    # Validate the whole result in a scratch folder next to the real one (same relative runtime path) before
    # touching the patch set: a refresh that would not load writes nothing.
    scratch = Path(tempfile.mkdtemp(prefix=f".{patchset.dir.name}.refresh-", dir=patchset.dir.parent))
    try:
        (scratch / PATCHSET_FILE).write_text(new_text)
        for name in names:
            (scratch / name).write_bytes(bodies[name])
        load_patchset(scratch / PATCHSET_FILE)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if dry_run:
        return _refresh_plan(patchset, names, bodies, base_files, old_text, new_text, kept)
    written, unchanged = [], []
    for name in names:
        target = patchset.dir / name
        if target.is_file() and not target.is_symlink() and target.read_bytes() == bodies[name]:
            unchanged.append(name)
            continue
        tmp = target.with_name(f".{name}.tmp")
        tmp.write_bytes(bodies[name])
        tmp.replace(target)
        written.append(name)
    if new_text != old_text:
        tmp = patchset.yaml_path.with_name(f".{PATCHSET_FILE}.tmp")
        tmp.write_text(new_text)
        tmp.replace(patchset.yaml_path)
    removed = []
    for old in patchset.series:
        if old not in names and (patchset.dir / old).is_file() and not (patchset.dir / old).is_symlink():
            (patchset.dir / old).unlink()
            removed.append(old)
    state["patches"] = [{"name": n, "commit": c, "subject": _commit_subject(repo, c)} for n, c in zip(names, commits, strict=True)]
    _write_state(repo, state)
    return RefreshResult(series=names, written=written, unchanged=unchanged, removed=removed, base_files=base_files,
                         yaml_rewritten=new_text != old_text, yaml_comments_kept=kept)


def _refresh_plan(patchset: PatchSet, names: list[str], bodies: dict[str, bytes], base_files: dict[str, str],
                  old_text: str, new_text: str, kept: bool) -> RefreshResult:
    """What refresh would write, with a unified diff per file, touching nothing."""
    import difflib

    def udiff(name: str, old: str, new: str) -> str:
        return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}"))

    written, unchanged, diffs = [], [], {}
    for name in names:
        target = patchset.dir / name
        old = target.read_bytes() if target.is_file() and not target.is_symlink() else b""
        if old == bodies[name]:
            unchanged.append(name)
            continue
        written.append(name)
        diffs[name] = udiff(name, old.decode("utf-8", "replace"), bodies[name].decode("utf-8", "replace"))
    removed = [old for old in patchset.series
               if old not in names and (patchset.dir / old).is_file() and not (patchset.dir / old).is_symlink()]
    for name in removed:
        diffs[name] = udiff(name, (patchset.dir / name).read_text(errors="replace"), "")
    if new_text != old_text:
        diffs[PATCHSET_FILE] = udiff(PATCHSET_FILE, old_text, new_text)
    return RefreshResult(series=names, written=written, unchanged=unchanged, removed=removed, base_files=base_files,
                         yaml_rewritten=new_text != old_text, yaml_comments_kept=kept, dry_run=True, diffs=diffs)


# -- editing patchset.yaml in place --------------------------------------------------------------------------------------
def update_yaml_text(text: str, *, series: list[str | dict[str, str]], base_files: dict[str, str]) -> tuple[str, bool]:
    """Replace the ``series`` list and ``base.files`` mapping, keeping every other line (and comments) as written.

    Returns (new text, True) or, when the layout is too unusual to edit line by line, a full re-dump (…, False).
    """
    lines = text.splitlines(keepends=True)
    try:
        lines = _replace_block(lines, top_key="series",
                               new=["series:\n", *[f"  - {_entry(s)}\n" for s in series]] if series else ["series: []\n"])
        files_block = ["  files:\n", *[f"    {p}: {h}\n" for p, h in sorted(base_files.items())]] if base_files \
            else ["  files: {}\n"]
        lines = _replace_nested(lines, parent="base", key="files", new=files_block)
        out = "".join(lines)
        doc = yaml.safe_load(out)
        if doc.get("series") == series and (doc["base"].get("files") or {}) == base_files:
            return out, True
    except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        pass
    doc = yaml.safe_load(text)
    doc["series"] = list(series)
    doc["base"]["files"] = dict(sorted(base_files.items()))
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False), False


def _entry(entry: str | dict[str, str]) -> str:
    """A series entry as one YAML line: the file name, or a flow mapping with its lifecycle fields."""
    if isinstance(entry, str):
        return entry
    return "{" + ", ".join(f"{k}: {v}" if k == "patch" else f'{k}: "{v}"' for k, v in entry.items()) + "}"


def series_entries(patchset: PatchSet, names: list[str]) -> list[str | dict[str, str]]:
    """``names`` as series entries, each keeping the lifecycle fields its entry has in ``patchset``."""
    from .format import LIFECYCLE_FIELDS

    by_name = {p.name: p for p in patchset.patches}
    out: list[str | dict[str, str]] = []
    for n in names:
        p = by_name.get(n)
        fields = {k: getattr(p, k) for k in LIFECYCLE_FIELDS if p is not None and getattr(p, k)}
        out.append({"patch": n, **fields} if fields else n)
    return out


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """Index after the last line belonging to the block whose key line is ``start`` (trailing blanks excluded)."""
    end = start + 1
    last = start + 1
    while end < len(lines):
        line = lines[end]
        stripped = line.strip()
        ind = len(line) - len(line.lstrip(" "))
        if stripped and not stripped.startswith("#"):
            if ind > indent or (ind == indent and stripped.startswith("- ")):
                last = end + 1  # deeper lines, or `key:\n- item` (list items at the key's indent)
            else:
                break
        end += 1
    return last


def _keep_key_line(line: str, indent: int, key: str) -> str:
    """The key line as written (with its comment), minus an inline empty value such as ``[]`` or ``{}``."""
    m = re.match(rf"^(\s*){key}:\s*(\[\s*\]|\{{\s*\}})?(\s*#.*)?$", line.rstrip("\n"))
    if m and not m.group(2):
        return line if line.endswith("\n") else line + "\n"
    comment = (m.group(3) or "") if m else ""
    return f"{' ' * indent}{key}:{comment}\n"


def _replace_block(lines: list[str], *, top_key: str, new: list[str]) -> list[str]:
    for i, line in enumerate(lines):
        if re.match(rf"^{top_key}:\s*(\[\s*\])?\s*(#.*)?$", line.rstrip("\n")):
            head = [_keep_key_line(line, 0, top_key)] if len(new) > 1 else [new[0]]
            return lines[:i] + head + new[1:] + lines[_block_end(lines, i, 0):]
    raise ValueError(f"no top-level {top_key}: block")


def _replace_nested(lines: list[str], *, parent: str, key: str, new: list[str]) -> list[str]:
    for i, line in enumerate(lines):
        if re.match(rf"^{parent}:\s*(#.*)?$", line.rstrip("\n")):
            pend = _block_end(lines, i, 0)
            for j in range(i + 1, pend):
                m = re.match(rf"^(\s+){key}:\s*(\{{\}})?\s*(#.*)?$", lines[j].rstrip("\n"))
                if m:
                    ind = len(m.group(1))
                    new = [(" " * ind) + ln.lstrip(" ") if k == 0 else (" " * (ind + 2)) + ln.lstrip(" ")
                           for k, ln in enumerate(new)]
                    if len(new) > 1:
                        new[0] = _keep_key_line(lines[j], ind, key)
                    return lines[:j] + new + lines[_block_end(lines, j, ind):]
            ind = next((len(ln) - len(ln.lstrip(" ")) for ln in lines[i + 1:pend] if ln.strip()), 2)
            new = [(" " * ind) + ln.lstrip(" ") if k == 0 else (" " * (ind + 2)) + ln.lstrip(" ")
                   for k, ln in enumerate(new)]
            return lines[:pend] + new + lines[pend:]
    raise ValueError(f"no top-level {parent}: block")

