"""The spec-v2 series on the real SGLang wheels: applies through the product, compiles, imports on CPU, listed."""
from __future__ import annotations

import json
import py_compile
import subprocess
import sys
from pathlib import Path

import yaml
from v2_helpers import REPO, run_python

GLUE = ["config", "draft_topk", "round", "sampling", "verify_input", "compat"]


def test_series_applies_and_every_file_compiles(v2_base: str, v2_tree: Path, tmp_path: Path):
    meta = yaml.safe_load((REPO / "patches" / "ddtree" / f"sglang-{v2_base}" / "patchset.yaml").read_text())
    overlay = json.loads((v2_tree / "overlay.json").read_text())
    assert overlay["base_version"] == v2_base
    files = set(overlay["files"])
    assert set(meta["base"]["files"]) <= files, "every base file the series touches is replaced by the overlay"
    assert {f"sglang/srt/speculative/ddtree_v2/{m}.py" for m in GLUE} <= files
    assert "sglang/srt/speculative/ddtree/__init__.py" in files
    for i, path in enumerate(sorted(p for p in files if p.endswith(".py"))):
        py_compile.compile(str(v2_tree / path), cfile=str(tmp_path / f"{i}.pyc"), doraise=True)


def test_patched_modules_import_on_cpu(v2_tree: Path, tmp_path: Path):
    mods = ["sglang.srt.server_args", "sglang.srt.arg_groups.speculative_hook", "sglang.srt.speculative.spec_info",
            "sglang.srt.speculative.dflash_info_v2", "sglang.srt.speculative.dflash_worker_v2",
            "sglang.srt.layers.attention.triton_backend",
            "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
            *[f"sglang.srt.speculative.ddtree_v2.{m}" for m in GLUE]]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('IMPORTED', len(sys.argv) - 1)\n"
    r = run_python(v2_tree, tmp_path, code, *mods)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"IMPORTED {len(mods)}" in r.stdout
    worker = (v2_tree / "sglang/srt/speculative/dflash_worker_v2.py").read_text()
    assert "self._ddtree.finish_round(" in worker and "self._ddtree.draft_builder(" in worker


def test_patchset_list_shows_the_spec_v2_bases(v2_base: str):
    r = subprocess.run([sys.executable, "-m", "ddtree_deploy", "patchset", "list", "--json",
                        "--patches", str(REPO / "patches")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    row = rows[f"ddtree/sglang-{v2_base}"]
    assert row["ok"] and row["base"] == f"sglang {v2_base}" and row["runtime_files"] > 20
