"""Paths and helpers of the SGLang 0.5.11 patch-set tests: unpack the base wheel, apply the series, hash, load.

Kept out of conftest.py because several test folders have a conftest, and `from conftest import ...` picks
whichever was loaded last.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PSET = REPO / "patches" / "ddtree" / "sglang-0.5.11"
CACHE = Path(os.environ.get("DDTREE_WHEEL_CACHE", Path.home() / ".cache" / "ddtree-deploy" / "wheels"))


def patchset() -> dict:
    return yaml.safe_load((PSET / "patchset.yaml").read_text())


def touched(patch: Path) -> list[str]:
    return [ln.split(" b/", 1)[1] for ln in patch.read_text().splitlines() if ln.startswith("diff --git a/")]


def unpack(wheel: Path, dest: Path, only: list[str] | None = None) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith("sglang/") and not n.endswith("/")]
        if only is not None:
            names = [n for n in names if n in set(only)]
        for n in names:
            p = dest / n
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(zf.read(n))


def apply_series(root: Path) -> None:
    meta = patchset()
    for p in meta["series"]:
        subprocess.run(["git", "apply", "-p1", "--verbose", str(PSET / p)], cwd=root, check=True,
                       capture_output=True, text=True)
    src = (PSET / meta["runtime"]["source"]).resolve()
    shutil.copytree(src, root / meta["runtime"]["dest"], ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
