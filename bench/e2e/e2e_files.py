"""Files of the e2e runs, read and written the same way by every script in bench/e2e.

- A run's raw results come back from the device as a tarball (`gpu_run.sh`: TAG-raw.tgz) or sit in a directory:
  one JSON per configuration (with a "config" key), plus logs/ and sometimes models/ and prof/.
- Every model maker reuses the tokenizer that models/mk_models.py writes into BASEDIR/tiny-qwen3.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path


def result_paths(stem: Path) -> tuple[Path, Path]:
    """A result's JSON and Markdown files: STEM.json and STEM.md. Not ``with_suffix``: a stem such as
    ``sglang-0.5.17-h200`` would lose everything after its version's first dot."""
    stem = Path(stem)
    return stem.parent / f"{stem.name}.json", stem.parent / f"{stem.name}.md"


def open_raw(src: Path) -> Path:
    """A directory holding the raw results: `src` itself, or a fresh temporary copy of the tarball `src`."""
    src = Path(src)
    if not src.is_file():
        return src
    td = Path(tempfile.mkdtemp())
    with tarfile.open(src) as t:
        t.extractall(td)
    return td


def load_results(src: Path, pattern: str = "*.json") -> dict:
    """Configuration name -> its result JSON, from a raw-results directory or tarball."""
    out = {}
    for f in open_raw(src).glob(pattern):
        d = json.loads(f.read_text())
        if "config" in d:
            out[d["config"]["name"]] = d
    return out


def merge_raws(raws: list[Path]) -> Path:
    """One directory with every configuration's result JSON, logs and profiler traces; a configuration of the same
    name in a later RAW replaces the earlier one. A TAG-raw.tgz's TAG-prof.tgz beside it (gpu_run.sh returns the
    traces in their own tarball) is unpacked into prof/ too."""
    out = Path(tempfile.mkdtemp())
    (out / "logs").mkdir()
    (out / "prof").mkdir()
    for raw in raws:
        prof = raw.with_name(raw.name.replace("-raw.tgz", "-prof.tgz"))
        if raw.name.endswith("-raw.tgz") and prof.exists():
            shutil.copytree(open_raw(prof) / "prof", out / "prof", dirs_exist_ok=True)
        src = open_raw(raw)
        for f in src.glob("*.json"):
            shutil.copy(f, out / f.name)
        for sub in ("logs", "prof"):
            if (src / sub).is_dir():
                shutil.copytree(src / sub, out / sub, dirs_exist_ok=True)
    return out


def copy_tokenizer(basedir: Path, *dests: Path) -> None:
    """Copy the tokenizer of BASEDIR/tiny-qwen3 (models/mk_models.py's output) into each of `dests`."""
    src = Path(basedir) / "tiny-qwen3"
    for f in os.listdir(src):
        if "token" in f or f.endswith(".jinja") or f == "special_tokens_map.json":
            for dst in dests:
                shutil.copy(src / f, dst)
