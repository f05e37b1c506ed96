"""How fast the patch-set stage is on the real wheels: load, apply (exact, 3-way), fail, diff, dev, refresh.

Usage: python bench/bench_patchset.py [--repeat N] [--no-dev]
Writes bench/results/patchset.json (medians in seconds, with the machine it ran on). Apply is measured from a warm
wheel (the zip is opened once, as in a real run that checks several patch sets); dev trees write the whole package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from ddtree_deploy.errors import PatchDoesNotApply  # noqa: E402
from ddtree_deploy.patchset.dev import make_dev_tree, refresh_patchset  # noqa: E402
from ddtree_deploy.patchset import WheelBase, apply_patchset, build_overlay, load_patchset, render_diff  # noqa: E402
from ddtree_deploy.wheels import fetch_wheel  # noqa: E402

FIX = REPO / "tests" / "patchsets"


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return {"median_s": round(statistics.median(runs), 6), "min_s": round(min(runs), 6), "runs": repeat}


def expect_failure(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except PatchDoesNotApply:
            return
        raise AssertionError("expected the series not to apply")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-dev", action="store_true", help="skip the whole-package dev/refresh timings")
    args = ap.parse_args()
    w011 = WheelBase(fetch_wheel("sglang", "0.5.11"))
    w023 = WheelBase(fetch_wheel("sglang", "0.5.23"))
    sample = load_patchset(FIX / "sample" / "sglang-0.5.23")
    moved = load_patchset(FIX / "moved" / "sglang-0.5.11")
    conflict = load_patchset(FIX / "conflict" / "sglang-0.5.11")
    results: dict[str, Any] = {}
    ddtree_yaml = REPO / "patches" / "ddtree" / "sglang-0.5.11" / "patchset.yaml"
    if ddtree_yaml.is_file():
        ddtree = load_patchset(ddtree_yaml)
        results["load ddtree/sglang-0.5.11 (validate yaml, parse series, list runtime)"] = timed(lambda: load_patchset(ddtree_yaml), args.repeat)
        results["apply ddtree/sglang-0.5.11 on the 0.5.11 wheel"] = timed(lambda: build_overlay(ddtree, w011), args.repeat)
        ov = build_overlay(ddtree, w011)
        results["render_diff ddtree overlay"] = timed(lambda: render_diff(ov, w011), args.repeat)
        results["ddtree overlay"] = {"files": len(ov.files), "bytes": sum(len(f.content) for f in ov.files),
                                     "patches": len(ddtree.patches)}
    results["apply sample on the 0.5.23 wheel (2 patches + 3 runtime files)"] = timed(lambda: build_overlay(sample, w023), args.repeat)
    results["detect conflicting hunk (conflict on 0.5.23, drift)"] = timed(
        expect_failure(lambda: build_overlay(conflict, w023, allow_base_drift=True)), args.repeat)
    results["refuse wrong base version (sample on 0.5.11)"] = timed(expect_failure(lambda: build_overlay(sample, w011)), args.repeat)
    results["3-way apply (moved on 0.5.23, pristine blobs from the 0.5.11 wheel)"] = timed(
        lambda: apply_patchset(moved, w023, allow_base_drift=True, three_way=True), args.repeat)
    if not args.no_dev:
        places = [("disk", None)] + ([("tmpfs", "/dev/shm")] if os.access("/dev/shm", os.W_OK) else [])
        for where, parent in places:
            for label, ps, wheel in (("0.5.11", moved, w011), ("0.5.23", sample, w023)):
                tmp = Path(tempfile.mkdtemp(prefix="bench-dev-", dir=parent))
                try:
                    shutil.copytree(ps.dir.parent, tmp / "family")
                    copy = load_patchset(tmp / "family" / ps.dir.name)
                    t = time.perf_counter()
                    tree = make_dev_tree(copy, wheel, tmp / "work")
                    dev_s = time.perf_counter() - t
                    t = time.perf_counter()
                    refresh_patchset(copy, tree.path)
                    refresh_s = time.perf_counter() - t
                    results[f"dev tree on {where}, whole sglang {label} package ({len(wheel.list_files())} files)"] = {"s": round(dev_s, 3)}
                    results[f"refresh from the {label} tree on {where}"] = {"s": round(refresh_s, 3)}
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                       "git": git_version}, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}
    out = HERE / "results" / "patchset.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for k, v in results.items():
        print(f"{k:<80} {v}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
