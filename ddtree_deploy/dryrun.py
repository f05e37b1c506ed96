"""Dry runs: what a write command would change, summarised first (files, +/- lines, what would restart), with the
full diff only on request. Every write command (apply, rollback, server start/stop/restart, probe
--record-baseline, patchset refresh) has ``--dry-run``; this module holds the parts they share.
"""

from __future__ import annotations

from typing import Any

from .inventory import Host
from .overlay import Overlay


def diff_stats(diff: str) -> list[dict[str, Any]]:
    """Per file of a git-style diff: path, lines added and removed, and whether it is new, changed or binary."""
    files: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[1] if " b/" in line else line.split()[-1]
            cur = {"path": path, "added": 0, "removed": 0, "kind": "changed"}
            files.append(cur)
        elif cur is None:
            continue
        elif line.startswith("new file mode"):
            cur["kind"] = "new"
        elif line.startswith("deleted file mode"):
            cur["kind"] = "deleted"
        elif line.startswith("Binary files"):
            cur["kind"] = "binary"
        elif line.startswith(("+++ ", "--- ")):
            continue
        elif line.startswith("+"):
            cur["added"] += 1
        elif line.startswith("-"):
            cur["removed"] += 1
    return files


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


def apply_summary(host: Host, overlay: Overlay, diff: str, *, record_baseline: bool, force: bool) -> dict[str, Any]:
    """What ``apply`` would do on ``host``: the files and lines, whether it would be "unchanged", whether a baseline
    would be recorded first, and what would restart. Reads the host's state (read-only)."""
    from .release import ReleaseManager
    from .server import ServerControl
    from .transport import HostConnection

    stats = diff_stats(diff)
    out: dict[str, Any] = {"files": stats, "added": sum(f["added"] for f in stats),
                           "removed": sum(f["removed"] for f in stats)}
    with HostConnection(host) as conn:
        info = ReleaseManager(conn).show()
        ctl = ServerControl(conn)
        state = info["state"]
        active = state["active"]
        rel = next((r for r in state["releases"] if r["id"] == active), None) if active else None
        out["active"] = active
        out["unchanged"] = bool(rel and rel.get("overlay_digest") == overlay.digest and rel.get("status") == "good" and not force)
        out["baseline"] = bool(record_baseline and host.probe.get("prompts")
                               and not conn.call("probe", "read_json", timeout=30, path=f"{host.release_root}/probe-baseline.json"))
        out["pending"] = state.get("pending")
        steps = []
        if out["pending"]:
            steps.append(f"settle release {out['pending'].get('release')}, left switched in but unprobed by run "
                         f"{out['pending'].get('run')} (roll it back)")
        if out["unchanged"]:
            steps.append(f"probe release {active}, which already holds this overlay; if it passes: nothing else "
                         "(no new release, no restart)")
        else:
            if out["baseline"]:
                steps.append("record a generation baseline first: " + ctl.describe("restart", release=active, ddtree=False)
                             + ", then back")
            steps.append(f"build a new release with {len(overlay.files)} overlay files (digest {overlay.digest[:12]}) and "
                         f"switch current to it (from {active or 'the installed package'})")
            steps.append(ctl.describe("restart", release="<new>", ddtree=True))
            steps.append("probe it; on failure roll back to " + (active or "the installed package"))
        out["steps"] = steps
    return out


__all__ = ["apply_summary", "diff_stats", "summary_lines"]
