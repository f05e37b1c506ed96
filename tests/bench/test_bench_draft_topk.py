"""bench/bench_draft_topk.py: refuses without a GPU (one line, exit 2, nothing written) and its smoke path runs the
real kernels (interpreted) through the real spec-v2 glue, writing the JSON and the table with the tokens checked
against the torch reference."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:  # not imported here: the runtime tests set TRITON_INTERPRET first
    pytest.skip("triton is not installed", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_draft_topk.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_refuses_without_cuda(tmp_path):
    r = _run("--out", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "bench_draft_topk: needs a CUDA GPU (torch sees none); use --smoke for the CPU smoke run"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the whole benchmark on tiny shapes: make test, not make test-fast
def test_smoke_run_writes_results(tmp_path):
    r = _run("--smoke", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "draft-topk-smoke.json").read_text())
    assert result["command"] == "python bench/bench_draft_topk.py --smoke"
    assert [(row["batch"], row["k"]) for row in result["rows"]] == [(1, 16), (2, 16)]
    for row in result["rows"]:
        assert row["tokens_equal_reference"] and row["max_logprob_diff"] < 1e-5
        assert row["chain_head_argmax_us"] > 0 and row["topk_us"] > 0
        assert row["overflow_rows"] == 0 and row["streaming_kernel_us"] > 0  # the gather path was timed
        assert row["first_call_s"] > 0
    assert result["verdict"]["met"] is None  # a CPU run makes no timing claim
    md = (tmp_path / "draft-topk-smoke.md").read_text()
    assert "no claim" in md and "| 2 | 4 | 16 |" in md and "first call s" in md


@pytest.mark.slow
def test_ks_and_batches_pick_the_cells_and_bad_ones_are_refused(tmp_path):
    r = _run("--smoke", "--ks", "4,32", "--batches", "1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "draft-topk-smoke-k32.json").read_text())  # named by its largest k
    assert [(row["batch"], row["k"]) for row in result["rows"]] == [(1, 4), (1, 32)]
    assert result["command"] == "python bench/bench_draft_topk.py --smoke --ks 4,32 --batches 1"
    for bad in (["--ks", "x"], ["--ks", "0"], ["--ks", "701"], ["--batches", "0"]):
        r = _run("--smoke", *bad, "--out", str(tmp_path / "bad"))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
        assert not (tmp_path / "bad").exists()
