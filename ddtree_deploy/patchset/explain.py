"""Why a patch does not apply: git's refusal turned into patch / file / hunk / expected / found, read from the patch
itself and the staged base file, and the message that names them (``SeriesDoesNotApply``, exit 5)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .base import BaseSource
from .diff import FilePatch, Hunk, PatchFile
from .format import PatchSet


def explain_failure(patch: PatchFile, stderr: str, stage: Path) -> dict[str, Any]:
    """Turn git's error output into patch/file/hunk/expected/found, reading the hunk from the patch itself."""
    m = re.search(r"error: patch failed: (.+):(\d+)$", stderr, re.M)
    if m:
        path, line = m.group(1), int(m.group(2))
        fp = next((f for f in patch.files if f.path == path or f.old_path == path), None)
        hunk = _find_hunk(fp, line) if fp else None
        info: dict[str, Any] = {"file": path, "reason": "hunk does not match", "git": stderr.strip()[-2000:]}
        if hunk is not None:
            info.update(_compare_hunk(hunk, stage / path))
            info["hunk"] = hunk.header
        info["summary"] = f"{path}: hunk {info.get('hunk', f'at line {line}')} does not match"
        return info
    m = re.search(r"error: (.+): No such file or directory$", stderr, re.M)
    if m:
        return {"file": m.group(1), "reason": "the base has no such file", "summary": f"{m.group(1)}: missing in the base",
                "git": stderr.strip()}
    m = re.search(r"error: (.+): already exists in working directory$", stderr, re.M)
    if m:
        return {"file": m.group(1), "reason": "the patch creates a file the base already has",
                "summary": f"{m.group(1)}: already exists", "git": stderr.strip()}
    return {"reason": "git apply refused the patch", "summary": "git apply refused the patch", "git": stderr.strip()[-2000:]}


def _find_hunk(fp: FilePatch, line: int) -> Hunk | None:
    for h in fp.hunks:
        if h.old_start == line:
            return h
    return fp.hunks[0] if fp.hunks else None


def _compare_hunk(hunk: Hunk, file: Path) -> dict[str, Any]:
    """Expected lines vs the closest window of the actual file (nearest to the hunk's position on ties)."""
    expected = hunk.expected
    try:
        actual = file.read_bytes().decode("utf-8", errors="replace").split("\n")
    except FileNotFoundError:
        return {"expected": expected, "found": [], "found_start": None}
    n, m = len(actual), len(expected)
    nominal = max(hunk.old_start - 1, 0)
    best = (-1, 0, nominal)
    for start in range(0, max(n - m, 0) + 1):
        score = sum(1 for k in range(m) if start + k < n and actual[start + k] == expected[k])
        key = (score, -abs(start - nominal))
        if key > (best[0], best[1]):
            best = (score, -abs(start - nominal), start)
    start = best[2]
    found = actual[start:start + m]
    first_diff = next((k for k in range(m) if k >= len(found) or found[k] != expected[k]), None)
    return {"expected": expected, "expected_start": hunk.old_start, "found": found, "found_start": start + 1,
            "equal_lines": max(best[0], 0), "first_difference": None if first_diff is None else first_diff}


def format_failure(patch: PatchFile, failure: dict[str, Any], patchset: PatchSet, base: BaseSource) -> str:
    lines = [f"{patch.name} does not apply to {base.package} {base.version} ({base.label}); nothing was produced",
             f"  patch set: {patchset.qualified_name}", f"  patch:     {patch.path}"]
    if failure.get("file"):
        lines.append(f"  file:      {failure['file']}")
    if failure.get("hunk"):
        lines.append(f"  hunk:      {failure['hunk']}")
    lines.append(f"  reason:    {failure.get('reason')}")
    if "expected" in failure and failure.get("found_start"):
        exp, found = failure["expected"], failure["found"]
        es, fs = failure["expected_start"], failure["found_start"]
        diff_at = failure.get("first_difference")
        lines.append(f"  expected (the patch's context and removed lines, from line {es}):")
        for k, text in enumerate(exp):
            lines.append(f"    {es + k:>6} | {text}")
        lines.append(f"  found (the base file at lines {fs}-{fs + max(len(found) - 1, 0)}, closest match: "
                     f"{failure['equal_lines']} of {len(exp)} lines equal; '!' marks lines that differ):")
        for k, text in enumerate(found):
            mark = "!" if k >= len(exp) or text != exp[k] else " "
            lines.append(f"  {mark} {fs + k:>6} | {text}")
        if diff_at is not None and diff_at < len(exp):
            got = found[diff_at] if diff_at < len(found) else "<end of file>"
            lines.append(f"  first difference: expected {exp[diff_at]!r}, found {got!r}")
    elif failure.get("git"):
        lines.append("  git said: " + failure["git"].replace("\n", "\n    "))
    if failure.get("three_way"):
        tw = failure["three_way"]
        lines.append(f"  --3way: also failed{': conflicts in ' + ', '.join(tw['conflicts']) if tw['conflicts'] else ''}")
        if not tw["conflicts"]:
            lines.append("    git said: " + tw["git"].replace("\n", "\n      "))
    return "\n".join(lines)
