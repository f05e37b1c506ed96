"""How fast `snapshot` is against a sandbox host, next to `rsync -a -e ssh` of the same tree in the same run.

Usage: python bench/bench_snapshot.py [--host NAME [--inventory DIR]] [--rounds 3] [--resnapshots 5]

Without --host it makes its own sandbox (one host with sglang 0.5.23: about 5,800 files, 131 MB) in a temporary
directory and removes it afterwards. Each round, interleaved so that machine load hits both alike:

- rsync: ``rsync -a -e "ssh -p PORT -i KEY -o UserKnownHostsFile=..."`` of ``sglang/`` and its dist-info into an
  empty directory (the same files the snapshot copies; ``__pycache__`` excluded on both sides);
- first snapshot, cold host: empty store, the host's hash and torch caches deleted (what a brand-new host costs:
  every file hashed on the host, torch imported there in parallel);
- first snapshot, warm host: empty store, host caches kept (a new store, e.g. another workstation);

then ``--resnapshots`` re-snapshots of the unchanged host into the last store. Results go to
bench/results/snapshot-sandbox.json and .md, with the machine's load average (the box is shared: compare rows of
the same run, not across runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from ddtree_deploy.inventory import Host, resolve_host  # noqa: E402
from ddtree_deploy.snapshot import SnapshotStore  # noqa: E402
from ddtree_deploy.transport import HostConnection  # noqa: E402


def rsync_once(host: Host, dist_info: str, dest: Path) -> float:
    ssh = ["ssh", "-p", str(host.port or 22), "-o", f"UserKnownHostsFile={os.path.expanduser(host.known_hosts)}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    if host.identity_file:
        ssh += ["-i", os.path.expanduser(host.identity_file)]
    target = f"{host.user + '@' if host.user else ''}{host.address}"
    sources = [f"{target}:{host.site_packages}/sglang", f"{target}:{host.site_packages}/{dist_info}"]
    dest.mkdir(parents=True)
    t = time.perf_counter()
    subprocess.run(["rsync", "-a", "--exclude", "__pycache__", "-e", shlex.join(ssh), *sources, str(dest) + "/"],
                   check=True, capture_output=True)
    return time.perf_counter() - t


def clear_host_caches(host: Host) -> None:
    with HostConnection(host) as conn:
        conn.run(f"rm -f {shlex.quote(host.release_root)}/.manifest-cache.json {shlex.quote(host.release_root)}/.facts-cache.json")


def snapshot_once(host: Host, root: Path) -> tuple[float, dict[str, Any], SnapshotStore]:
    store = SnapshotStore(root)
    t = time.perf_counter()
    snap = store.take(host)
    return time.perf_counter() - t, snap.info["stats"], store


def summary(values: list[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
            "max_s": round(max(values), 3), "runs_s": [round(v, 3) for v in values]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", help="an inventory host to measure (default: a sandbox made for this run)")
    ap.add_argument("--inventory", type=Path, help="inventory directory for --host")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--resnapshots", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=REPO / ".cache",
                    help="where stores and rsync copies are written (same filesystem for both)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    box = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-snapshot-", dir=args.workdir if args.workdir.exists() else None))
    try:
        if args.host:
            host = resolve_host(args.host, args.inventory)
        else:
            from ddtree_deploy.sandbox import Sandbox

            box = Sandbox(tmp / "sandbox", tmp / "hosts", log=lambda m: print(m, file=sys.stderr))
            box.up((("bench-0523", "0.5.23"),))
            host = resolve_host("bench-0523", tmp / "hosts")
        probe_store = SnapshotStore(tmp / "probe")
        probe = probe_store.take(host)  # also checks the host works before anything is timed
        dist_info = probe.info["dist_info"]
        shutil.rmtree(tmp / "probe")
        load_before = os.getloadavg()
        rsync_s, cold_s, warm_s = [], [], []
        cold_stats: dict[str, Any] = {}
        store = None
        for r in range(args.rounds):
            rsync_s.append(rsync_once(host, dist_info, tmp / f"rsync-{r}"))
            shutil.rmtree(tmp / f"rsync-{r}")
            clear_host_caches(host)
            seconds, cold_stats, _ = snapshot_once(host, tmp / f"cold-{r}")
            cold_s.append(seconds)
            shutil.rmtree(tmp / f"cold-{r}")
            seconds, _stats, store = snapshot_once(host, tmp / f"warm-{r}")
            warm_s.append(seconds)
            if r < args.rounds - 1:
                shutil.rmtree(tmp / f"warm-{r}")
            print(f"round {r + 1}: rsync {rsync_s[-1]:.2f}s  first snapshot cold host {cold_s[-1]:.2f}s  "
                  f"warm host {warm_s[-1]:.2f}s", file=sys.stderr)
        assert store is not None
        re_s, re_stats = [], []
        for _ in range(args.resnapshots):
            t = time.perf_counter()
            snap = store.take(host)
            re_s.append(time.perf_counter() - t)
            re_stats.append(snap.info["stats"])
        load_after = os.getloadavg()
        verify_problems = store.verify(snap)
    finally:
        if box is not None:
            box.down()
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "benchmark": "snapshot vs rsync -a -e ssh, same run, interleaved rounds",
        "host": host.name,
        "sglang": probe.package_version,
        "files": cold_stats.get("files"),
        "bytes": cold_stats.get("bytes"),
        "blobs": cold_stats.get("blobs_transferred"),
        "wire": cold_stats.get("wire"),
        "wire_bytes": cold_stats.get("wire_bytes"),
        "rsync": summary(rsync_s),
        "first_snapshot_cold_host": summary(cold_s),
        "first_snapshot_warm_host": summary(warm_s),
        "unchanged_resnapshot": summary(re_s),
        "resnapshot_blobs_transferred": sum(s["blobs_transferred"] for s in re_stats),
        "resnapshot_host_hashed": sum(s["host_hashed"] for s in re_stats),
        "verify_after": "ok" if not verify_problems else verify_problems[:3],
        "criteria": {
            "first_snapshot_not_slower_than_rsync": statistics.median(cold_s) <= statistics.median(rsync_s),
            "first_snapshot_warm_host_not_slower_than_rsync": statistics.median(warm_s) <= statistics.median(rsync_s),
            "unchanged_resnapshot_under_1s": max(re_s) < 1.0,
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in load_after],
                    "note": "the sandbox host shares this machine's CPUs; other work on the box shows in loadavg"},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "snapshot-sandbox.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "snapshot-sandbox.md").write_text(render_md(result))
    print(render_md(result))


def render_md(r: dict[str, Any]) -> str:
    def row(name: str, s: dict[str, Any]) -> str:
        return f"| {name} | {s['median_s']:.2f} | {s['min_s']:.2f} | {s['max_s']:.2f} | {', '.join(f'{v:.2f}' for v in s['runs_s'])} |"

    c = r["criteria"]
    m = r["machine"]
    return "\n".join([
        f"# snapshot vs rsync — {r['host']} (sglang {r['sglang']}, {r['files']} files, {r['bytes'] / 1e6:.0f} MB)",
        "",
        f"Measured {r['when']} by `python bench/bench_snapshot.py`; rounds interleaved in one run. Snapshot wire "
        f"format: {r['wire']} ({r['wire_bytes'] / 1e6:.0f} MB on the wire for {r['blobs']} blobs). "
        f"{m['cpus']} CPUs shared with the sandbox host; load average {m['loadavg_before'][0]} before, "
        f"{m['loadavg_after'][0]} after.",
        "",
        "| what | median s | min s | max s | runs |",
        "|---|---|---|---|---|",
        row("rsync -a -e ssh (same files)", r["rsync"]),
        row("first snapshot, cold host (hash all + import torch on host)", r["first_snapshot_cold_host"]),
        row("first snapshot, empty store, warm host caches", r["first_snapshot_warm_host"]),
        row("unchanged re-snapshot", r["unchanged_resnapshot"]),
        "",
        f"- first snapshot (cold host) no slower than rsync (medians): "
        f"**{'yes' if c['first_snapshot_not_slower_than_rsync'] else 'NO'}**",
        f"- first snapshot into an empty store, host caches warm, no slower than rsync (medians): "
        f"**{'yes' if c['first_snapshot_warm_host_not_slower_than_rsync'] else 'NO'}**",
        f"- unchanged re-snapshot under 1 s (every run): **{'yes' if c['unchanged_resnapshot_under_1s'] else 'NO'}**; "
        f"blobs transferred by re-snapshots: {r['resnapshot_blobs_transferred']}, files re-hashed on the host: "
        f"{r['resnapshot_host_hashed']}",
        f"- `verify` after the run: {r['verify_after']}",
        "",
    ])


if __name__ == "__main__":
    main()
