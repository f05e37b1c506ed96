"""Dry runs: what a write command would change, summarised first (files, +/- lines), the full diff only on request.
Every write command (apply, rollback, server start/stop/restart, probe --record-baseline, patchset refresh) has
``--dry-run``; this module holds the counting they share. The counts are ``git apply --numstat``'s (git reads the
diff; we do not parse it a second time). What ``apply`` would do is ``decide.decide``'s list of steps.
"""

from __future__ import annotations

import subprocess
from typing import Any

from .errors import OperationFailed


def numstat(diff: str, binary: list[str] | None = None) -> list[dict[str, Any]]:
    """Per file of a git-style diff: path, lines added and removed (``git apply --numstat``), and whether it is new,
    changed or binary. ``binary``: the files the diff names only as "Binary files ... differ" (git lists those
    without a GIT binary patch not at all)."""
    if not diff.strip():
        return []
    try:
        proc = subprocess.run(["git", "apply", "--numstat", "--summary", "-"], input=diff, capture_output=True,
                              text=True, timeout=120, env={"GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
                                                           "PATH": "/usr/local/bin:/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OperationFailed(f"counting the diff with `git apply --numstat` failed: {exc}") from None
    if proc.returncode != 0:
        raise OperationFailed(f"`git apply --numstat` refused the diff: {proc.stderr.strip()[-500:]}")
    files: dict[str, dict[str, Any]] = {}
    created = set()
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            added, removed, path = parts
            opaque = added == "-"
            files[path] = {"path": path, "added": 0 if opaque else int(added), "removed": 0 if opaque else int(removed),
                           "kind": "binary" if opaque else "changed"}
        elif line.startswith(" create mode "):
            created.add(line.split(" ", 4)[-1])
    for path in created & set(files):
        files[path]["kind"] = "new" if files[path]["kind"] != "binary" else "binary"
    for path in binary or []:
        files.setdefault(path, {"path": path, "added": 0, "removed": 0, "kind": "binary"})
    return sorted(files.values(), key=lambda f: f["path"])


def summary_lines(stats: list[dict[str, Any]], limit: int = 40) -> list[str]:
    """The summary a person reads first: one line per file (the first ``limit``), then the totals."""
    out = []
    width = max((len(f["path"]) for f in stats[:limit]), default=0)
    for f in stats[:limit]:
        out.append(f"  {f['path']:<{width}}  +{f['added']:<5} -{f['removed']:<5} {f['kind']}")
    if len(stats) > limit:
        out.append(f"  … {len(stats) - limit} more files")
    added = sum(f["added"] for f in stats)
    removed = sum(f["removed"] for f in stats)
    out.append(f"  {len(stats)} files, +{added} -{removed} lines")
    return out


__all__ = ["numstat", "summary_lines"]
