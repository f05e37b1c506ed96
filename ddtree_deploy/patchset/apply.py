"""Apply a patch set onto a base, all or nothing, and produce an :class:`~ddtree_deploy.overlay.Overlay`.

Order of checks, each fatal before anything is staged: same package; same base version (``allow_base_drift``
turns a mismatch into a loud note); sha256 of every file in ``base.files`` (a mismatch names the file, expected
and found hash); files the series creates must not exist in the base. Then only the touched files are staged in
a fresh temporary git repository and every patch runs through ``git apply --check`` then ``git apply`` (``-p1``,
no fuzz: git has only exact context, with offsets). The first failing hunk stops everything: the staging directory
is deleted, no overlay is returned, and the error names the patch, the file, the hunk header, the lines the patch
expected and the closest lines the file has. ``three_way`` retries a failing patch with ``git apply --3way``
(preimage blobs come from the patch set's own base release), and every patch that needed it is reported.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import OperationFailed, PatchDoesNotApply
from ..overlay import Overlay, OverlayFile
from .base import BaseSource, WheelBase, as_base_source
from .explain import explain_failure, format_failure
from .diff import MODE_EXEC, PatchFile
from .format import MAX_FILE_BYTES, PatchSet, read_vendored
from .plugin import check_hooks, format_mismatches, plugin_files
from .lifecycle import gate
from .traits import traits_files

Progress = Callable[[str], None]


def git_env(**extra: str) -> dict[str, str]:
    """An environment where the user's git configuration cannot change what git apply or diff produce."""
    env = dict(os.environ)
    env.update({
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C", "LANG": "C",
        "GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": "ddtree-deploy", "GIT_AUTHOR_EMAIL": "ddtree-deploy@localhost",
        "GIT_COMMITTER_NAME": "ddtree-deploy", "GIT_COMMITTER_EMAIL": "ddtree-deploy@localhost",
    })
    env.update(extra)
    return env


def git(cwd: Path, *args: str, input: bytes | None = None, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run git in ``cwd`` with the isolated environment; raise OperationFailed with git's message on failure."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env or git_env())
    except FileNotFoundError:
        raise OperationFailed("git is not installed; the patch engine needs it (apt-get install git)") from None
    if check and proc.returncode != 0:
        raise OperationFailed(f"git {' '.join(args[:3])} failed in {cwd}: {proc.stderr.decode(errors='replace').strip()}")
    return proc


def init_repo(path: Path) -> None:
    git(path, "init", "-q")
    git(path, "config", "core.autocrlf", "false")
    git(path, "config", "core.fileMode", "true")


class SeriesDoesNotApply(PatchDoesNotApply):
    """A patch of the series does not apply (exit 5); ``details`` holds the machine-readable report."""

    def __init__(self, message: str, *, details: dict[str, Any], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.details = details


@dataclass
class PatchStep:
    """What happened to one patch of the series."""

    name: str
    files: list[str]
    status: str  # "applied" | "3-way" | "present" | "skipped" | "failed" | "not reached"
    detail: str = ""


@dataclass
class ApplyResult:
    overlay: Overlay
    steps: list[PatchStep]
    warnings: list[str] = field(default_factory=list)  # loud: base drift, hash mismatches accepted under drift

    def describe(self) -> dict[str, Any]:
        return {"ok": True, "overlay": self.overlay.describe(), "warnings": self.warnings,
                "steps": [s.__dict__ for s in self.steps],
                "replaces": sorted(f.path for f in self.overlay.files if f.action == "replace")}


def build_overlay(patchset: PatchSet, base: BaseSource, *, allow_base_drift: bool = False,
                  three_way: bool = False) -> Overlay:
    """The overlay the patch set makes of ``base``; raises PatchDoesNotApply (exit 5) and builds nothing on failure."""
    return apply_patchset(patchset, base, allow_base_drift=allow_base_drift, three_way=three_way).overlay


def apply_patchset(patchset: PatchSet, base: BaseSource, *, allow_base_drift: bool = False, three_way: bool = False,
                   progress: Progress | None = None) -> ApplyResult:
    """Like :func:`build_overlay`, also returning per-patch steps and the warnings for the report."""
    base = as_base_source(base)
    warnings = check_base(patchset, base, allow_base_drift=allow_base_drift)
    hashes = check_hook_targets(patchset, base, allow_base_drift=allow_base_drift, warnings=warnings)
    try:
        return _apply(patchset, base, warnings, three_way=three_way, say=progress or (lambda _msg: None),
                      hook_hashes=hashes)
    except SeriesDoesNotApply as exc:
        if warnings:  # a failure under --allow-base-drift still says loudly that the base was not the right one
            exc.message = "\n".join([*warnings, exc.message])
            exc.details["warnings"] = warnings
        raise


def check_hook_targets(patchset: PatchSet, base: BaseSource, *, allow_base_drift: bool,
                       warnings: list[str]) -> dict[int, str]:
    """Every hook's target exists in the base with the recorded sha256: a changed or missing target is refused like
    a hunk that does not apply (exit 5). Under ``allow_base_drift`` it is a loud warning instead, and the hook table
    records the base's hash (the plugin on the host checks against it). Returns those hashes by hook index."""
    mismatches = check_hooks(patchset, base)
    if not mismatches:
        return {}
    text = format_mismatches(patchset, base.label, mismatches)
    missing = [m for m in mismatches if m["found"] == "missing"]
    if not allow_base_drift or missing:
        raise SeriesDoesNotApply(text, details={"reason": "hook target changed", "hooks": mismatches},
                                 hint="port the patch set (`ddtree-deploy patchset port`): it re-reads every hook's "
                                 "target and records its new hash once the hook is checked against it")
    warnings.append("BASE DRIFT: " + text.replace("; nothing was produced", "") + " — recorded as found because "
                    "--allow-base-drift was given")
    by_target = {m["hook"]: m["found"] for m in mismatches}
    return {h.index: by_target[h.label] for h in patchset.hooks if h.label in by_target}


def _apply(patchset: PatchSet, base: BaseSource, warnings: list[str], *, three_way: bool, say: Progress,
           hook_hashes: dict[int, str] | None = None) -> ApplyResult:
    touched = patchset.touched_files()
    created = patchset.created_files()
    for path, pname in created.items():
        if base.has(path):
            raise SeriesDoesNotApply(
                f"{pname} creates {path}, but {base.package} {base.version} ({base.label}) already has that file; "
                "nothing was produced",
                details={"patch": pname, "file": path, "reason": "file already exists in the base"},
            )
    staged = sorted(p for p in touched if p not in created)
    for path in staged:
        if not base.has(path):
            raise SeriesDoesNotApply(
                f"{touched[path]} changes {path}, but {base.package} {base.version} ({base.label}) has no such file; "
                "nothing was produced",
                details={"patch": touched[path], "file": path, "reason": "file missing in the base"},
            )
    base_bytes = base.read_many(staged)
    steps = [PatchStep(p.name, p.touched, "not reached") for p in patchset.patches]
    notes: list[str] = list(warnings)
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-stage-"))
    try:
        stage = tmp / "stage"
        stage.mkdir()
        init_repo(stage)
        for path in staged:
            target = stage / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base_bytes[path])
            target.chmod(base.mode(path))
        if three_way:
            git(stage, "add", "-A")
        pristine: list[str | None] = []  # imported once, on the first patch that needs a 3-way merge

        def need_pristine() -> None:
            if not pristine:
                pristine.append(import_pristine_blobs(stage, patchset, tmp / "pristine"))
                if pristine[0]:
                    notes.append(pristine[0])

        for idx, patch in enumerate(patchset.patches):
            verdict, why = gate(patch, base.package, base.version)
            if verdict == "refuse":
                steps[idx] = PatchStep(patch.name, patch.touched, "failed", why)
                raise SeriesDoesNotApply(
                    f"{why}; nothing was produced", details={"patch": patch.name, "reason": "applies_to",
                                                              "steps": [s.__dict__ for s in steps]},
                    hint="port the series to this base (`ddtree-deploy patchset port`)")
            if verdict == "skip":
                steps[idx] = PatchStep(patch.name, patch.touched, "skipped", why)
                notes.append(f"{patch.name} skipped: {why}")
                continue
            say(f"applying {patch.name}")
            steps[idx] = _apply_one(stage, patch, patchset, base, three_way=three_way, steps=steps, idx=idx,
                                    before_merge=need_pristine)
            if steps[idx].status == "present":
                notes.append(f"{patch.name} skipped: {steps[idx].detail}")
            if steps[idx].status == "3-way":
                notes.append(f"--3way used: {patch.name} did not apply exactly; {steps[idx].detail}")
        files = sorted(_collect(stage, patchset, base, base_bytes, staged, created)
                       + plugin_files(patchset, hook_hashes) + traits_files(patchset), key=lambda f: f.path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    overlay = Overlay(package=base.package, patchset=patchset.qualified_name, patchset_version=patchset.version,
                      base_version=base.version, base_snapshot=base.snapshot_id, files=tuple(files), notes=tuple(notes))
    return ApplyResult(overlay=overlay, steps=steps, warnings=warnings)


def check_base(patchset: PatchSet, base: BaseSource, *, allow_base_drift: bool) -> list[str]:
    """Package, version and base-file hashes. Fatal unless ``allow_base_drift``; then returned as loud warnings."""
    if base.package != patchset.base_package:
        raise PatchDoesNotApply(f"patch set {patchset.qualified_name} patches {patchset.base_package}, "
                                f"but the base ({base.label}) is {base.package}")
    warnings: list[str] = []
    if base.version != patchset.base_version:
        msg = (f"BASE DRIFT: patch set {patchset.qualified_name} was made for {patchset.base_package} "
               f"{patchset.base_version}, but the base ({base.label}) is {base.package} {base.version}")
        if not allow_base_drift:
            raise PatchDoesNotApply(msg, hint="use the patch set made for this version, port this one with "
                                    "`patchset dev` + `patchset refresh`, or pass --allow-base-drift to try anyway")
        warnings.append(msg + " — applying anyway because --allow-base-drift was given")
    mismatches: list[dict[str, str]] = []
    for path, expected in sorted(patchset.base_files.items()):
        found = base.sha256(path) if base.has(path) else "missing"
        if found != expected:
            mismatches.append({"file": path, "expected": expected, "found": found})
    if mismatches:
        lines = [f"  {m['file']}: expected sha256 {m['expected']}, found {m['found']}" for m in mismatches]
        head = (f"{len(mismatches)} base file(s) differ from what patch set {patchset.qualified_name} was made "
                f"against ({base.label}):")
        if not allow_base_drift:
            raise SeriesDoesNotApply("\n".join([head, *lines]), details={"reason": "base file hash mismatch",
                                     "mismatches": mismatches},
                                     hint="the host's files were modified or this is another build; snapshot again or "
                                     "pass --allow-base-drift to try anyway")
        warnings.append("BASE DRIFT: " + "\n".join([head, *lines]))
    return warnings


def import_pristine_blobs(stage: Path, patchset: PatchSet, work: Path) -> str | None:
    """Put the blobs every patch was made against into ``stage``'s object store, so ``--3way`` can merge.

    They come from the patch set's own base release (the cached wheel), with the series applied in order on top.
    Returns a note when they cannot be had; 3-way then only works where the target still has those blobs.
    """
    from ..wheels import fetch_wheel

    try:
        pristine = WheelBase(fetch_wheel(patchset.base_package, patchset.base_version), package=patchset.base_package)
    except Exception as exc:  # network or cache trouble: 3-way degrades, it does not crash the run
        return f"--3way: pristine {patchset.base_package} {patchset.base_version} unavailable ({exc}); merging without it"
    try:
        work.mkdir(parents=True)
        init_repo(work)
        created = patchset.created_files()
        paths = [p for p in patchset.touched_files() if p not in created and pristine.has(p)]
        for p in paths:
            data = pristine.read(p)
            if p in patchset.base_files and hashlib.sha256(data).hexdigest() != patchset.base_files[p]:
                return f"--3way: pristine {p} does not match base.files; merging without pristine blobs"
            (work / p).parent.mkdir(parents=True, exist_ok=True)
            (work / p).write_bytes(data)
        _store_blobs(stage, work, paths)
        for patch in patchset.patches:
            proc = git(work, "apply", "-p1", "--whitespace=nowarn", str(patch.path), check=False)
            if proc.returncode != 0:
                return f"--3way: {patch.name} does not apply to its own base; later patches merge without pristine blobs"
            _store_blobs(stage, work, [p for p in patch.touched if (work / p).is_file()])
    finally:
        pristine.close()
    return None


def _store_blobs(stage: Path, work: Path, paths: list[str]) -> None:
    if paths:
        git(stage, "hash-object", "-w", "--stdin-paths", input="\n".join(str(work / p) for p in paths).encode())


def _apply_one(stage: Path, patch: PatchFile, patchset: PatchSet, base: BaseSource, *, three_way: bool,
               steps: list[PatchStep], idx: int, before_merge: Callable[[], None]) -> PatchStep:
    args = ["apply", "-p1", "--whitespace=nowarn"]
    check = git(stage, *args, "--check", "-v", str(patch.path), check=False)
    if check.returncode == 0:
        git(stage, *args, str(patch.path))
        if three_way:
            git(stage, "add", "-A")  # keep the index in step for a later 3-way merge
        return PatchStep(patch.name, patch.touched, "applied")
    if git(stage, *args, "--reverse", "--check", str(patch.path), check=False).returncode == 0:
        return PatchStep(patch.name, patch.touched, "present", "already in the base (reverse-applies cleanly): skipped")
    failure = explain_failure(patch, check.stderr.decode(errors="replace"), stage)
    if three_way:
        before_merge()
        merged = git(stage, *args, "--3way", str(patch.path), check=False)
        out = (merged.stderr + merged.stdout).decode(errors="replace")
        conflicted = sorted(set(re.findall(r"^U (.+)$", out, re.M)) | set(re.findall(r"Applied patch to '(.+)' with conflicts", out)))
        if merged.returncode == 0 and not conflicted:
            clean = re.findall(r"Applied patch to '(.+)' cleanly", out)
            git(stage, "add", "-A")
            return PatchStep(patch.name, patch.touched, "3-way",
                             f"3-way merged {', '.join(clean) or ', '.join(patch.touched)} (plain apply failed at "
                             f"{failure.get('file', '?')} {failure.get('hunk', '')})".rstrip())
        failure["three_way"] = {"conflicts": conflicted, "git": out.strip()[-2000:]}
    steps[idx] = PatchStep(patch.name, patch.touched, "failed", failure.get("summary", ""))
    raise SeriesDoesNotApply(format_failure(patch, failure, patchset, base),
                             details={"patch": patch.name, **{k: v for k, v in failure.items() if k != "summary"},
                                      "steps": [s.__dict__ for s in steps]},
                             hint=None if three_way else "if upstream only moved code around, try --3way (reported)")


def _collect(stage: Path, patchset: PatchSet, base: BaseSource, base_bytes: dict[str, bytes], staged: list[str],
             created: dict[str, str]) -> list[OverlayFile]:
    """The files that changed (replace) or appeared (add), then the vendored runtime files."""
    final_mode: dict[str, str] = {}
    for p in patchset.patches:
        for f in p.files:
            if f.result_mode:
                final_mode[f.path] = f.result_mode
    files: list[OverlayFile] = []
    for path in sorted(set(staged) | set(created)):
        target = stage / path
        content = target.read_bytes()
        if len(content) > MAX_FILE_BYTES and path in created:
            raise PatchDoesNotApply(f"{created[path]} creates {path} of {len(content)} bytes, over the limit")
        if path in created:
            mode = 0o755 if final_mode.get(path) == MODE_EXEC else 0o644
            files.append(OverlayFile(path=path, content=content, mode=mode, action="add"))
        else:
            mode = base.mode(path)
            if path in final_mode:
                mode = 0o755 if final_mode[path] == MODE_EXEC else 0o644
            if content != base_bytes[path] or mode != base.mode(path):
                files.append(OverlayFile(path=path, content=content, mode=mode, action="replace"))
    for vendored in patchset.vendored:
        for dest, src in vendored.files:
            data = read_vendored(src, what="runtime file")
            mode = 0o755 if os.stat(src).st_mode & 0o111 else 0o644
            files.append(OverlayFile(path=dest, content=data, mode=mode, action="replace" if base.has(dest) else "add"))
    return sorted(files, key=lambda f: f.path)


# -- the dry-run diff ----------------------------------------------------------------------------------------------------
def render_diff(overlay: Overlay, base: BaseSource) -> str:
    """A git-style unified diff of every overlay file against the base (``git apply -p1`` on the base reproduces
    the overlay). Used by ``patchset diff`` and ``apply --dry-run``."""
    base = as_base_source(base)
    chunks: list[str] = []
    for f in sorted(overlay.files, key=lambda f: f.path):
        old = base.read(f.path) if f.action == "replace" and base.has(f.path) else None
        old_mode = base.mode(f.path) if old is not None else None
        head = [f"diff --git a/{f.path} b/{f.path}\n"]
        if old is None:
            head.append(f"new file mode {_git_mode(f.mode)}\n")
        elif old_mode is not None and _git_mode(old_mode) != _git_mode(f.mode):
            head += [f"old mode {_git_mode(old_mode)}\n", f"new mode {_git_mode(f.mode)}\n"]
        body = _text_diff(old, f.content, f.path)
        if body is None:
            head.append(f"Binary files {'a/' + f.path if old is not None else '/dev/null'} and b/{f.path} differ\n")
            body = ""
        if body or len(head) > 1:
            chunks.append("".join(head) + body)
    return "".join(chunks)


def _git_mode(mode: int) -> str:
    return "100755" if mode & 0o111 else "100644"


def _text_diff(old: bytes | None, new: bytes, path: str) -> str | None:
    try:
        a = old.decode("utf-8") if old is not None else ""
        b = new.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\0" in a or "\0" in b:
        return None
    if a == b:
        return ""
    out: list[str] = []
    for line in difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                     fromfile=f"a/{path}" if old is not None else "/dev/null", tofile=f"b/{path}", n=3):
        if line.startswith(("--- ", "+++ ")):
            out.append(line.rstrip("\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)
