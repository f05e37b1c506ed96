"""Build the DDTree overlay (changed + new files only) from the base wheel, the patch series and the runtime.

Usage: python bench/e2e/build_overlay.py OUTDIR [--wheel WHEEL]
Writes OUTDIR/sglang/... : every file the series changes or adds, plus the runtime at its `dest`, exactly as
`git apply` (fuzz 0) produces them on a directory laid out like site-packages. On the GPU host the overlay is
laid over a copy of the installed package (see gpu_run.sh); the full package is never duplicated here.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PSET = REPO / "patches" / "ddtree" / "sglang-0.5.11"


def touched(patch: Path) -> list[str]:
    out = []
    for line in patch.read_text().splitlines():
        if line.startswith("diff --git a/"):
            out.append(line.split(" b/", 1)[1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--wheel", type=Path, default=None)
    a = ap.parse_args()
    meta = yaml.safe_load((PSET / "patchset.yaml").read_text())
    wheel = a.wheel or next((Path.home() / ".cache/ddtree-deploy/wheels").glob("sglang-0.5.11-*.whl"))
    zf = zipfile.ZipFile(wheel)
    names = set(zf.namelist())
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        for f in files:
            if f in names:
                (td / f).parent.mkdir(parents=True, exist_ok=True)
                (td / f).write_bytes(zf.read(f))
        subprocess.run(["git", "init", "-q"], cwd=td, check=True)
        for p in meta["series"]:
            subprocess.run(["git", "apply", "-p1", "-C3", str(PSET / p)], cwd=td, check=True)
        if a.outdir.exists():
            shutil.rmtree(a.outdir)
        for f in files:
            (a.outdir / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(td / f, a.outdir / f)
    src = (PSET / meta["runtime"]["source"]).resolve()
    dest = a.outdir / meta["runtime"]["dest"]
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    print("overlay", a.outdir, len(files), "patched files + runtime at", meta["runtime"]["dest"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
