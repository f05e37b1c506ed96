"""bench/bench_verify_gemm.py and bench/bench_verify_attention.py: without a GPU they refuse (one line, exit 2,
nothing written), bad flags are refused the same way, and the smoke runs write their tables, the attention one with
DDTree's kernel (interpreted) equal to its float32 reference."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each case starts the benchmark in a new Python (torch imported): make test only


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("script", ["bench_verify_gemm.py", "bench_verify_attention.py"])
def test_refusals_write_nothing(tmp_path, script):
    prog = script[:-3]
    cases = [(["--smoke", "--batches", "1,x"], f"{prog}: --batches takes positive integers separated by commas"),
             (["--smoke", "--widths", "0"], f"{prog}: --widths takes positive integers")]
    if not torch.cuda.is_available():
        cases.append(([], f"{prog}: needs a CUDA GPU (torch sees none); use --smoke for the CPU smoke run"))
    for args, line in cases:
        r = _run(script, *args, "--out", str(tmp_path))
        assert r.returncode == 2 and r.stderr.strip().startswith(line), (args, r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_gemm_smoke_table(tmp_path):
    r = _run("bench_verify_gemm.py", "--smoke", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "verify-gemm-smoke.json").read_text())["rows"]
    assert [(x["batch"], x["width"], x["m"]) for x in rows] == [(1, 4, 4), (1, 5, 5), (2, 4, 8), (2, 5, 10)]
    assert all(x["ms"] > 0 and x["first_width"] == 4 for x in rows)
    assert "| 2 | 5 | 10 |" in (tmp_path / "verify-gemm-smoke.md").read_text()


def test_attention_smoke_table_checks_the_kernel(tmp_path):
    r = _run("bench_verify_attention.py", "--smoke", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "verify-attention-smoke.json").read_text())["rows"]
    assert len(rows) == 4 and all("ddtree_ms" in x and not any(k.endswith("_error") for k in x) for x in rows)
    assert all(x["ddtree_vs_fp32_ref"] < 1e-4 for x in rows), rows
